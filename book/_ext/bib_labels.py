"""Sphinx extension: citation labels as BibTeX's alpha style makes them, for a one-word author too.

alpha.bst labels a single author by the initials of the last name, or, when they are fewer than two
letters, by its first three letters ("Keys" 1981: [Key81]). pybtex's port abbreviates only names that start
with a capital, so a lowercase pseudonym keeps the whole word ("bloc97" 2023: [bloc9723]). This style
takes the first three letters there, as alpha.bst does ([blo23]); a braced institution ({Meta AI}) keeps
its name, as before. Used through `bibtex_default_style: posenc-alpha` in _config.yml.
"""
import re
import unicodedata

from pybtex.plugin import register_plugin
from pybtex.style.formatting.alpha import Style as AlphaStyle
from pybtex.style.labels.alpha import LabelStyle as AlphaLabels


def _letters(parts) -> str:
    """The name's letters and digits, accents dropped ("Müller" gives "Muller")."""
    text = unicodedata.normalize("NFD", "".join(parts))
    return re.sub(r"[^0-9A-Za-z]", "", "".join(c for c in text if not unicodedata.combining(c)))


class LabelStyle(AlphaLabels):
    def format_lab_names(self, persons):
        label = super().format_lab_names(persons)
        if len(persons) == 1 and len(label) > 3 and not any(n.startswith("{") for n in persons[0].last_names):
            return _letters(persons[0].last_names)[:3]
        return label


class Style(AlphaStyle):
    default_label_style = LabelStyle


def setup(app):
    register_plugin("pybtex.style.formatting", "posenc-alpha", Style)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
