"""Cleaning, decoding and segmentation on tricky inputs (real text cut from the sample corpora)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.cleaning.clean import Cleaner, nfkc, strip_html
from bertpipe.lib.textseg import split_sentences
from bertpipe.stages.prepare.ingest import Ingest, decode, strip_pos_tags
from bertpipe.lib.cleaning.params import CleanParams
from bertpipe.stages.prepare.params import SourceParams

DATA = Path(__file__).parent / "data" / "prepare"
LAW = "为了保护专利权人的合法权益，鼓励发明创造，推动发明创造的应用，制定本法。"


def clean(text: str, **kw) -> str | None:
    return Cleaner(CleanParams(**kw))(text)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("ＡＢＣ１２３：第一条", "ABC123:第一条"),  # full-width ASCII -> half-width
        ("第一条\u3000\u3000本法所称", "第一条 本法所称"),  # ideographic spaces collapse
        ("专利\u200b权\u200d人\ufeff的\x07合法", "专利权人的合法"),  # zero-width, BOM, control chars
        ("<p>第一条</p><p>本法&nbsp;所称&lt;专利&gt;</p>", "第一条\n本法 所称<专利>"),
        ("<b>加粗</b>的<a href='x'>链接</a>文字", "加粗的链接文字"),
        ("  行一  \r\n\n\n  行二\t\t尾  ", "行一\n行二 尾"),
        ("😀专利权人😀", "😀专利权人😀"),  # emoji are kept (not control characters)
        ("①②③", "123"),  # NFKC compatibility digits
    ],
)
def test_normalise(raw, expected):
    assert Cleaner(CleanParams()).normalise(raw.replace("\r\n", "\n")) == expected


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("   \u200b\n\t ", "empty"),
        ("好", "too_short"),
        ("This sentence is entirely English and has no Chinese at all.", "low_cjk_ratio"),
        ("ДобройночиДобройночи это русский", "low_cjk_ratio"),
        ("😀😀😀🎉🎉🎉👍👍👍✨✨", "low_cjk_ratio"),  # emoji only: no letters at all
        ("哈" * 20 + "，太好笑了", "char_repeat"),
        ("这本书很好！！！！！！！！！！！！！！", "char_repeat"),
        ("【】《》「」『』※※，。、；：？！…—·★☆" + "好书", "symbol_junk"),
        (LAW * 600, "too_long"),
    ],
)
def test_filters_name_their_reason(text, reason):
    c = Cleaner(CleanParams())
    assert c(text) is None
    assert c.removed[reason] == 1, c.removed
    assert sum(c.removed.values()) == 1


@pytest.mark.parametrize(
    "text",
    [
        LAW,
        "我买了iPhone 15和MacBook，感觉很好用，推荐给大家！",  # mixed scripts, mostly Chinese
        "第三条　国务院专利行政部门负责管理全国的专利工作；统一受理和审查专利申请，依法授予专利权。",
        "今天心情不错😀，和朋友去看了电影🎬。",
        "ＧＢ１８０３０编码的文件也要能读，全角字母要转半角。",
    ],
)
def test_good_text_survives(text):
    c = Cleaner(CleanParams())
    out = c(text)
    assert out is not None and out == unicodedata.normalize("NFKC", out)
    assert sum(c.removed.values()) == 0


def test_masking_counts():
    c = Cleaner(CleanParams(mask_urls=True, mask_emails=True, mask_phones=True))
    out = c("请访问www.example.com或者http://a.cn/x?y=1，邮件 bob@example.org，电话13812345678，座机010-62345678。")
    assert out is not None
    assert "[URL]" in out and "[EMAIL]" in out and "[PHONE]" in out
    assert "example" not in out and "13812345678" not in out
    assert c.masked == {"url": 2, "email": 1, "phone": 2}


def test_masking_off_by_default():
    assert "www.example.com" in clean("请访问www.example.com看看这本书的介绍吧")


def test_nfkc_fast_path_matches_unicodedata():
    samples = [LAW, "ＡＢＣ，。！？（）【】①㎡ｶﾞ\u3000ﬁ", "e\u0301 Ｅ\u0301", "中文\uff0c\u3000English"]
    for s in samples:
        assert nfkc(s) == unicodedata.normalize("NFKC", s)


def test_strip_html_keeps_text_between_tags():
    assert strip_html("<div>甲</div><!-- 注释 --><span>乙</span>&amp;&#20013;&#x6587;") == "\n甲\n乙&中文"


# ---------------------------------------------------------------- decoding


def test_gb18030_file_is_detected(tmp_path):
    path = DATA / "neg_gb18030.txt"
    raw = path.read_bytes()
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    text = decode(raw, path)
    assert "\r" not in text
    assert text == raw.decode("gb18030").replace("\r\n", "\n")
    docs = list(Ingest(Path).documents([SourceParams(path=str(path), format="txt")], "general"))
    assert len(docs) == 30
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in d["text"]) for d in docs)


def test_utf8_bom_and_crlf(tmp_path):
    p = tmp_path / "bom.txt"
    p.write_bytes(b"\xef\xbb\xbf" + "第一行\r\n第二行\r第三行\n".encode("utf-8"))
    docs = list(Ingest(Path).documents([SourceParams(path=str(p))], "domain"))
    assert [d["text"] for d in docs] == ["第一行", "第二行", "第三行"]


@pytest.mark.parametrize("lines_after", [0, 60])
def test_broken_utf8_names_file_line_and_offset(tmp_path, lines_after):
    """A truncated character on line 3, in a short file and in a long real one: UTF-8 error, not GB18030 mojibake."""
    real = (DATA / "pos_small.txt").read_text(encoding="utf-8").split("\n")
    p = tmp_path / "broken.txt"
    good = ("\n".join(real[:2]) + "\n").encode("utf-8")
    tail = ("第三行\n" + "\n".join(real[2 : 2 + lines_after])).encode("utf-8")
    p.write_bytes(good + b"\xe4\xb8" + tail)
    with pytest.raises(BertpipeError, match=rf"broken\.txt:3: byte offset {len(good)}: expected UTF-8"):
        list(Ingest(Path).documents([SourceParams(path=str(p))], "domain"))


def test_binary_is_rejected(tmp_path):
    p = tmp_path / "blob.txt"
    p.write_bytes(b"abc\n\x00\x01\x02\xff\xfe\x80")
    with pytest.raises(BertpipeError, match=r"blob\.txt:2: byte offset 4"):
        decode(p.read_bytes(), p)


def test_forced_encoding_error(tmp_path):
    with pytest.raises(BertpipeError, match=r"x\.txt:1: byte offset 0: expected utf-8 text"):
        decode("中文".encode("gb18030"), "x.txt", "utf-8")


# ---------------------------------------------------------------- People's Daily POS tags


def test_strip_pos_tags_real_lines():
    lines = (DATA / "199801_small.txt").read_text(encoding="utf-8").split("\n")
    first = strip_pos_tags(lines[0])
    assert first == "迈向充满希望的新世纪——一九九八年新年讲话(附图片1张)".replace("(", "（").replace(")", "）").replace("1", "１")
    for line in lines:
        out = strip_pos_tags(line)
        assert "/" not in out.replace("１/", "") or not line.strip()


@pytest.mark.parametrize(
    "tagged, plain",
    [
        ("[中央/n  人民/n  广播/vn  电台/n]nt  报道/v", "中央人民广播电台报道"),
        ("Windows/nx  98/m  发布/v", "Windows 98发布"),
        ("１/m  ／/w  ２/m", "１／２"),
        ("", ""),
    ],
)
def test_strip_pos_tags(tagged, plain):
    assert strip_pos_tags(tagged) == plain


# ---------------------------------------------------------------- sentences


@pytest.mark.parametrize(
    "text, sentences",
    [
        ("他说：“好！”然后走了。", ["他说：“好！”", "然后走了。"]),
        ("真的吗？？是的!!好。", ["真的吗？？", "是的!!", "好。"]),
        ("第一款；第二款。\n第二条", ["第一款；", "第二款。", "第二条"]),
        ("等等……然后呢", ["等等……", "然后呢"]),
        ("（一）船舶；（二）货物。", ["（一）船舶；", "（二）货物。"]),
        ("", []),
        ("\n\n  \n", []),
        ("没有标点的一句话", ["没有标点的一句话"]),
        ("「好。」『行！』", ["「好。」", "『行！』"]),
        ("It costs 1.5 yuan. Buy it!", ["It costs 1.5 yuan.", "Buy it!"]),
        ("！！开头的标点", ["！！", "开头的标点"]),
    ],
)
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_split_sentences_loses_no_characters():
    text = (DATA / "pos_small.txt").read_text(encoding="utf-8")
    for line in text.split("\n")[:200]:
        assert "".join(split_sentences(line)).replace(" ", "") == line.strip().replace(" ", "").replace("\u3000", "")
