#!/usr/bin/env python3
"""Expected SmolLM2 token ids from Hugging Face `tokenizers`, for mmpost's BPE parity test.

Texts: the hostile strings of tests/golden/fixtures/bpe/expected.json (NBSP, ideographic space,
NEL, line/paragraph separators, combining marks, emoji ZWJ, CJK, Arabic-Indic digits, CRLF,
special tokens typed in text) plus real text from Debian-packaged files present on the machine
(/usr/share/common-licenses/*, /usr/share/doc/*/copyright), cut into chunks of ~4 KB, up to
--mb megabytes. Writes {"texts", "ids", "bytes"} to OUT (JSON); the C++ test
"byte-level BPE on the real SmolLM2-135M tokenizer" compares mmpost's ids with them.

    .venv/bin/python scripts/parity/smollm2_tokenizer.py MODEL_DIR OUT.json [--mb 3]
"""
import argparse
import glob
import json
import os

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def debian_text(limit):
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/*/copyright"))
    chunks, total = [], 0
    for path in files:
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        for i in range(0, len(text), 4096):
            chunk = text[i:i + 4096]
            chunks.append(chunk)
            total += len(chunk.encode("utf-8"))
            if total >= limit:
                return chunks
    return chunks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=3.0)
    a = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    with open(os.path.join(ROOT, "tests/golden/fixtures/bpe/expected.json"), encoding="utf-8") as f:
        hostile = json.load(f)["texts"]
    texts = hostile + debian_text(int(a.mb * 1e6))
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"texts": texts, "ids": ids, "bytes": n_bytes}, f, ensure_ascii=False)
    print(json.dumps({"texts": len(texts), "bytes": n_bytes, "ids": sum(map(len, ids))}))


if __name__ == "__main__":
    main()
