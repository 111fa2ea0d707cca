"""The keyed stores (the fair-MLM windows, the pretrain token store) take their code identity from bertpipe.core.codeid:
the module that builds a store and every bertpipe module it imports, found from the imports as a stage's code is.
An edit to the segmentation, or to a module the tokenization starts to import, makes a new key.

Each key is computed in a fresh interpreter that runs an edited copy of the package (nothing is monkeypatched)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
KEYS = r"""
import json, sys
from pathlib import Path
from types import SimpleNamespace

import bertpipe
from bertpipe.lib.keyedstore import store_key
from bertpipe.lib.measures import windows
from bertpipe.stages.pretrain import tokstore

corpus = Path(sys.argv[1])
evaluate = SimpleNamespace(mlm_max_texts=10, mlm_seed=0, mlm_mask_prob=0.15)
tokenizer = SimpleNamespace(cls_token_id=2, sep_token_id=3)
packing = SimpleNamespace(pair_objective="none", max_seq_len=64, cross_document=True)
print(json.dumps({"package": bertpipe.__file__,
                  "windows": store_key(windows.key_parts(corpus, evaluate, 60)),
                  "tokens": store_key(tokstore.key_parts(corpus, "test", tokenizer, "zh", packing, 0, 0))}))
"""


@pytest.fixture()
def copy(tmp_path):
    """A copy of the package, and a prepared corpus whose key part is its fingerprint (no text is read)."""
    root = tmp_path / "code"
    shutil.copytree(REPO / "bertpipe", root / "bertpipe", ignore=shutil.ignore_patterns("__pycache__"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "manifest.json").write_text(json.dumps({"fingerprint": "f" * 32}))
    return SimpleNamespace(root=root, corpus=corpus)


def keys(copy) -> dict:
    env = {**os.environ, "PYTHONPATH": str(copy.root)}
    out = subprocess.run([sys.executable, "-c", KEYS, str(copy.corpus)], cwd=copy.root, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got.pop("package")).resolve() == (copy.root / "bertpipe" / "__init__.py").resolve()  # the copy ran
    return got


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_editing_the_segmentation_makes_new_window_and_token_stores(copy):
    before = keys(copy)
    assert keys(copy) == before  # the key is a function of the code: nothing else moves it
    # jieba without its HMM for unknown words: other word boundaries, other masked spans and whole-word ids
    edit(copy.root / "bertpipe" / "lib" / "textseg.py", "def jieba_spans(text: str, hmm: bool = True)",
         "def jieba_spans(text: str, hmm: bool = False)")
    after = keys(copy)
    assert after["windows"] != before["windows"]
    assert after["tokens"] != before["tokens"]


def test_a_module_the_tokenization_starts_to_import_counts(copy):
    """No list to forget: a helper module textseg starts to import is part of both stores' code the moment it is
    imported, so editing the helper makes new stores too."""
    pkg = copy.root / "bertpipe" / "lib"
    (pkg / "textseg_rules.py").write_text('"""Characters that end a sentence."""\n\nENDS = "。！？"\n')
    edit(pkg / "textseg.py", "from __future__ import annotations\n",
         "from __future__ import annotations\n\nfrom bertpipe.lib.textseg_rules import ENDS  # noqa: F401\n")
    before = keys(copy)
    edit(pkg / "textseg_rules.py", 'ENDS = "。！？"', 'ENDS = "。！？；"')
    after = keys(copy)
    assert after["windows"] != before["windows"]
    assert after["tokens"] != before["tokens"]


def test_store_code_is_the_builder_and_what_it_imports():
    from bertpipe.core.codeid import module_code

    windows = module_code(("bertpipe.lib.measures.windows",))
    assert {"bertpipe/lib/measures/windows.py", "bertpipe/lib/textseg.py", "bertpipe/lib/corpusio.py"} <= set(windows)
    assert not any(f.startswith("bertpipe/stages/vocab/") or f.endswith("fair_mlm.py") for f in windows)  # not the scorer
    tokens = module_code(("bertpipe.stages.pretrain.tokstore",))
    assert {"bertpipe/stages/pretrain/tokstore.py", "bertpipe/lib/mlm/data.py", "bertpipe/lib/textseg.py"} <= set(tokens)
    assert "bertpipe/lib/mlm/train.py" not in tokens  # training code never moves the store
    with pytest.raises(ValueError, match="no such module"):
        module_code(("bertpipe.no_such_module",))
