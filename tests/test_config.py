import pytest

from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError


def write(tmp_path, text):
    p = tmp_path / "params.yaml"
    p.write_text(text)
    return p


def test_profile_and_set_override(tmp_path):
    p = write(
        tmp_path,
        "profile: small\nmodel: {base: scratch}\nprofiles:\n  small: {model.language: en}\n"
        "  big: {model: {base: x, tokenizer: big-tok}}\n",
    )
    cfg = load_config(p)
    assert cfg.params.model.language == "en" and cfg.params.profile == "small"
    cfg = load_config(p, profile="big")
    # the file's own top-level key wins over the profile (what `dvc exp run -S` edits); the profile fills the rest
    assert cfg.params.model.base == "scratch" and cfg.params.model.tokenizer == "big-tok"
    cfg = load_config(p, profile="big", overrides=["model.tokenizer=tok", "model.base=y"])
    assert cfg.params.model.base == "y" and cfg.params.model.tokenizer == "tok"
    assert cfg.root == tmp_path.resolve()


@pytest.mark.parametrize(
    "text, overrides, expected",
    [
        ("model: {bse: x}\n", [], "model.bse: unknown key"),
        ("model: {language: fr}\n", [], "model.language"),
        ("paths: [1, 2]\n", [], "paths"),
        ("model: {base: x}\n", ["nosection.key=1"], "nosection: unknown key"),
        ("model: {base: x}\n", ["model.base"], "expected KEY.PATH=VALUE"),
        ("profile: huge\n", [], "profile 'huge' is not defined"),
        ("model: {base: [unclosed\n", [], "params.yaml:2"),
    ],
)
def test_bad_params_are_one_line_errors(tmp_path, text, overrides, expected):
    p = write(tmp_path, text)
    with pytest.raises(BertpipeError) as e:
        load_config(p, overrides=overrides)
    msg = str(e.value)
    assert expected in msg and "\n" not in msg and ("params.yaml" in msg or "--set" in msg), msg


def test_missing_params_file_is_an_error(tmp_path):
    with pytest.raises(BertpipeError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_unquoted_compile_switch_means_the_word_written(tmp_path):
    # PyYAML reads an unquoted on/off as true/false; every stage's `compile` takes it as the word written
    p = write(tmp_path, "base: {compile: on}\npretrain: {compile: off}\nfinetune: {train: {compile: on}}\n")
    cfg = load_config(p)
    assert cfg.params.base.compile == "on" and cfg.params.pretrain.compile == "off"
    assert cfg.params.finetune.train.compile == "on"
    with pytest.raises(BertpipeError) as e:  # anything else is still refused, naming the key
        load_config(write(tmp_path, "pretrain: {compile: sometimes}\n"))
    assert "pretrain.compile" in str(e.value) and "\n" not in str(e.value)
