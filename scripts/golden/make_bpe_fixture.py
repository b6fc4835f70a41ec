"""Golden fixture for mmpost's byte-level BPE (lib/mmpost/data/bpe.cpp) vs Hugging Face
`tokenizers` (tests/golden/test_bpe_golden.cpp).

Trains four small byte-level BPE tokenizers with `tokenizers` (vocab 600) on the repository's
README.md, one per pre-tokenizer family, and writes tests/golden/fixtures/bpe/:
  gpt2/tokenizer.json      ByteLevel(add_prefix_space=False) with GPT-2's regex
  smollm/tokenizer.json    Sequence[Digits(individual_digits), ByteLevel]  (SmolLM2)
  llama3/tokenizer.json    Sequence[Split(Llama-3 regex, Isolated), ByteLevel(use_regex=False)],
                           ignore_merges (Llama-3)
  qwen2/tokenizer.json     NFC normalizer, Sequence[Split(Qwen2 regex: single digits, Isolated),
                           ByteLevel(use_regex=False)] (Qwen2 / Qwen2-VL)
  expected.json            per tokenizer and text: the ids, the pre-tokenization pieces and the
                           decoded text `tokenizers` gives (encode without special tokens)
The texts are hostile: NBSP, ideographic space, NEL, line/paragraph separators, combining marks,
emoji ZWJ sequences, CJK, Arabic-Indic digits, CRLF, tabs, runs of spaces, contractions.

Deterministic given the tokenizers version. Run: .venv/bin/python scripts/golden/make_bpe_fixture.py
"""
import json
import os
import shutil

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "golden", "fixtures", "bpe")

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "Hello world! It's a test, isn't it? We'll see; they'd've LOVED IT'S",
    "In 2024 I had 12345 cats and 3.14159 dogs.",
    "non\u00a0breaking\u00a0space and ideographic\u3000space",
    "next\u0085line, line\u2028separator, paragraph\u2029separator",
    "e\u0301 vs \u00e9, n\u0303, a\u0308\u0304 combining marks",
    "family \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 and \U0001F44D\U0001F3FD",
    "中文字符和日本語のテキスト、한국어",
    "Arabic-Indic digits \u0661\u0662\u0663 and \u06F4\u06F5 and fullwidth \uFF11\uFF12",
    "windows\r\nline\r\nendings\r\n\r\n",
    "tabs\tand\t\ttabs   and    spaces     ",
    "   leading spaces",
    "trailing spaces   ",
    "<|im_start|>user\nnot special here<|im_end|>",
    "x" * 40 + " " + "ab" * 25,
    "",
    " ",
    "\n\n\n",
    "mixed123abc456 a1b2c3 ½ ² Ⅻ",
    # NFC (Qwen2): decomposed accents compose, the Angstrom and Ohm signs become letters, Hangul
    # jamo compose to syllables; compatibility forms (ﬁ, ①) stay.
    "Café Å Ω 각 ﬁ ① Å",
]


def corpus():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    return [line for line in text.splitlines() if line.strip()] + TEXTS


def build(kind):
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif kind == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.ByteLevel(add_prefix_space=False)])
    elif kind == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    expected = {"generator": "scripts/golden/make_bpe_fixture.py",
                "tokenizers": tokenizers.__version__, "texts": TEXTS, "tokenizers_": {}}
    for kind in ("gpt2", "smollm", "llama3", "qwen2"):
        tok = build(kind)
        d = os.path.join(OUT, kind)
        os.makedirs(d)
        tok.save(os.path.join(d, "tokenizer.json"))
        rows = []
        for t in TEXTS:
            enc = tok.encode(t, add_special_tokens=False)
            normalized = tok.normalizer.normalize_str(t) if tok.normalizer else t
            pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(normalized)]
            decoded = tok.decode(enc.ids, skip_special_tokens=False)
            assert decoded == normalized, (kind, t)
            rows.append({"ids": enc.ids, "pieces": pieces, "decoded": decoded})
        expected["tokenizers_"][kind] = rows
        print(kind, tok.get_vocab_size(), "tokens")
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
