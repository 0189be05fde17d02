"""The repository address lives in _config.yml alone: badges, install cells and the README agree with it."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_badge_and_install_cell_uses_the_configured_repository():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "set_repository.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_colab_badge_image_is_shipped_with_the_book():
    assert (ROOT / "book" / "images" / "colab-badge.svg").is_file()
    first = (ROOT / "notebooks" / "02_sinusoidal.ipynb").read_text()
    assert "../book/images/colab-badge.svg" in first and "colab-badge.svg)" in first
    assert "colab.research.google.com/assets" not in first          # no hot-linked image
