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
    assert len(files) == 12
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


#: chapter -> the schemes its opening diagram stands for
CHAPTER_SCHEMES = {
    "00_attention_without_position": ["nope"], "01_learned": ["learned"], "02_sinusoidal": ["sinusoidal"],
    "03_floater": ["floater"], "04_multiplicative": ["multiplicative"], "05_shaw": ["shaw"],
    "06_transformer_xl": ["xl"], "07_t5": ["t5"], "07b_relative_comparison": ["shaw", "xl", "t5"],
    "08_tupe": ["tupe"], "09_deberta": ["deberta"], "10_complex_order": ["complex"], "11_rope": ["rope"],
    "14_alibi": ["alibi"], "16_rope_extension": ["rope", "xpos"],
    "17_learned_biases": ["kerple", "fire", "cope", "rope"],
}


def test_each_chapters_diagram_highlights_the_hooks_its_schemes_override():
    """The diagram atop a chapter is named for the `Scheme` hooks its schemes implement (alphabetical; `values`:
    `extra_values`), so that no chapter shows a term its scheme does not have (TUPE's values, say)."""
    import json
    import re

    import posenc
    hook_of = {"embed": "input", "layer_input": "input", "transform_qk": "qk", "logit_bias": "bias",
               "layer_logit_bias": "bias", "extra_logits": "extra", "extra_values": "values"}
    variants = load_script().VARIANTS
    for chapter, schemes in CHAPTER_SCHEMES.items():
        hooks = {hook for name in schemes for method, hook in hook_of.items()
                 if getattr(posenc.SCHEMES[name], method) is not getattr(posenc.Scheme, method)}
        text = "".join("".join(c["source"]) for c in json.loads((ROOT / "notebooks" / f"{chapter}.ipynb").read_text())
                       ["cells"] if c["cell_type"] == "markdown")
        shown = re.findall(r"images/hooks/([\w-]+)\.svg", text)
        assert shown == ["-".join(sorted(hooks)) or "none"], (chapter, shown, sorted(hooks))
        assert set(variants[shown[0]]) == hooks, chapter
