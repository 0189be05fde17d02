"""The "where position enters" SVGs are what scripts/make_diagram.py draws, and are well-formed."""
import importlib.util
import pathlib
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
SVG = "{http://www.w3.org/2000/svg}"


def load_script():
    spec = importlib.util.spec_from_file_location("make_diagram", ROOT / "scripts" / "make_diagram.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_diagrams_are_up_to_date():
    assert load_script().check() == []


def test_diagrams_are_scalable_accessible_svg():
    files = load_script().render()
    assert len(files) == 9
    for path in files:
        root = ET.parse(path).getroot()
        assert root.tag == SVG + "svg", path
        assert root.get("viewBox") and root.get("width") == "100%" and root.get("height") is None, path
        assert (root.findtext(SVG + "title") or "").strip(), f"{path} has no <title>"
        assert (root.findtext(SVG + "desc") or "").strip(), f"{path} has no <desc>"
        assert not list(root.iter(SVG + "script")), f"{path} has a script"



def test_the_cost_figures_colour_each_hook_as_the_diagrams_do():
    from posenc.plots import HOOK_COLOR
    hooks = load_script().HOOKS
    assert HOOK_COLOR == {"input": hooks["input"][0], "q/k": hooks["qk"][0], "bias": hooks["bias"][0],
                          "custom": hooks["extra"][0]}
