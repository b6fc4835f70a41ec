"""Golden fixture for mmpost's chat-template renderer vs Hugging Face transformers'
`apply_chat_template` (tokenize=False), on four real checkpoints' chat templates.

The rendered text comes from transformers' own code, imported, not a transcription: a
`PreTrainedTokenizerFast` (transformers 5: `TokenizersBackend`) built from the repository's small
tests/golden/fixtures/bpe/smollm/tokenizer.json, with the checkpoint's special tokens
(bos/eos/unk/pad, which `apply_chat_template` passes to the template) and `chat_template=` set,
then `tokenizer.apply_chat_template(hf_messages, tokenize=False, add_generation_prompt=...)`.
That is `transformers.utils.chat_template_utils.render_jinja_template` on the template compiled
by `_compile_jinja_template` (ImmutableSandboxedEnvironment, trim_blocks=True,
lstrip_blocks=True, the `{% generation %}` extension, loopcontrols). The vocabulary does not
matter with tokenize=False. For llava the same messages also go through a real
`LlavaProcessor.apply_chat_template` (the path llava-hf checkpoints use) and must give the same
text; qwen2_vl's processor needs torchvision (its video processor) and is tried the same way if
it can be built.

Templates (verbatim copies, sources in scripts/golden/chat_templates/SOURCES.md):
  smollm2   HuggingFaceTB/SmolLM2-135M-Instruct
  qwen2_vl  Qwen/Qwen2-VL-2B-Instruct (= Qwen2-VL-7B-Instruct)
  llama3    meta-llama/Meta-Llama-3-8B-Instruct
  llava     llava-hf/llava-1.5-7b-hf (chat_template.json)

Writes tests/golden/fixtures/chat_templates/:
  <name>.jinja   the template text, byte for byte (so a C++ test can check recognition)
  expected.json  a list of cases, each
                   template               smollm2 | qwen2_vl | llama3 | llava
                   name                   conversation name (unique per template)
                   messages               mmpost form: [{role, content: string}], each image is the
                                          literal "<image>\n" at the start of the content
                   hf_messages            what transformers got: plain strings for smollm2/llama3;
                                          content lists [{"type":"image"}, ..., {"type":"text",
                                          "text": ...}] for qwen2_vl/llava
                   add_generation_prompt  false | true
                   kwargs                 extra template variables passed ({} or
                                          {"add_vision_id": true} for some qwen2_vl cases)
                   special_tokens         the special_tokens_map the template saw
                   image_layout           how one image in `messages` maps to rendered text
                   rendered               transformers' output

mmpost form <-> HF form: a message's content is the images first, one "<image>\n" each, then the
text (one text part). This is the convention of mmpost's parse_messages (lib/mmpost/data/
sft_dataset.cpp), which turns an HF content list into "<image>\n" per image + the text parts; the
script checks that mapping hf_messages back that way gives `messages`. A message with images and
no text gets no text item; a message with neither gets one text item with "" (llava renders a text
item as text + " ", so the difference shows).

Deterministic. Run: .venv/bin/python scripts/golden/make_chat_template_fixture.py
"""
import json
import os
import shutil
import sys

import transformers
from transformers import PreTrainedTokenizerFast

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SRC = os.path.join(ROOT, "scripts", "golden", "chat_templates")
OUT = os.path.join(ROOT, "tests", "golden", "fixtures", "chat_templates")
VOCAB = os.path.join(ROOT, "tests", "golden", "fixtures", "bpe", "smollm", "tokenizer.json")

IMG = "<image>\n"  # one image in mmpost form

# Special tokens of each checkpoint's tokenizer_config.json (those the template can see).
SPECIAL_TOKENS = {
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                "pad_token": "<|im_end|>"},
    "qwen2_vl": {"bos_token": None, "eos_token": "<|im_end|>", "unk_token": None,
                 "pad_token": "<|endoftext|>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "unk_token": None,
               "pad_token": None},
    "llava": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
}

IMAGE_LAYOUT = {
    "smollm2": "no images (text-only template)",
    "qwen2_vl": "each leading \"<image>\\n\" of an mmpost content is one {\"type\":\"image\"} item before "
                "the text item; it renders as \"<|vision_start|><|image_pad|><|vision_end|>\" (no "
                "newline: the \"\\n\" belongs to the mmpost placeholder), the text follows directly; "
                "with add_vision_id each image is preceded by \"Picture N: \" (N counts images over "
                "the whole conversation from 1)",
    "llama3": "no images (text-only template)",
    "llava": "each leading \"<image>\\n\" of an mmpost content is one {\"type\":\"image\"} item before "
             "the text item; the template renders all images of a message first, each as "
             "\"<image>\\n\", then the text, so the mmpost content appears verbatim",
}

MULTIMODAL = {"qwen2_vl", "llava"}

# Conversations in mmpost form. Images only in the multimodal templates' own list below.
TEXT_CONVERSATIONS = [
    ("single_user", [
        {"role": "user", "content": "What is 2+2?"}]),
    ("with_system", [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a prime number."}]),
    ("no_system_user_assistant", [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi there. How can I help?"}]),
    ("multi_turn", [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome."}]),
    ("multi_turn_with_system", [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Color of the sky?"},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Color of grass?"}]),
    ("non_ascii_emoji", [
        {"role": "system", "content": "Réponds en français, s'il te plaît. 日本語もOK。"},
        {"role": "user", "content": "Größe von 🐘 vs 🐭? Ответь кратко — 한국어 괜찮아요 👍🏽👨‍👩‍👧"},
        {"role": "assistant", "content": "L'éléphant 🐘 est bien plus grand ✅ (大きい)."}]),
    ("whitespace", [
        {"role": "user", "content": "  leading and trailing spaces  \n\n"},
        {"role": "assistant", "content": "\n\t answer with tab and newlines \n"},
        {"role": "user", "content": "\nline one\nline two\n"}]),
    ("unicode_whitespace", [
        {"role": "user", "content": "\u00a0\u3000nbsp and ideographic space\u2028\u00a0"},
        {"role": "assistant", "content": "\u2003em space\u0085 ok\u200b"}]),
    ("empty_assistant", [
        {"role": "user", "content": "Say nothing."},
        {"role": "assistant", "content": ""}]),
    ("template_like_text", [
        {"role": "user", "content": "Print {{ messages }} and {% if x %}y{% endif %} literally: <|im_end|>"},
        {"role": "assistant", "content": "{{ messages }} {% if x %}y{% endif %} <|im_end|>"}]),
    ("system_only", [
        {"role": "system", "content": "You are a helpful assistant."}]),
]

IMAGE_CONVERSATIONS = [
    ("one_image", [
        {"role": "user", "content": IMG + "What digit is this?"}]),
    ("one_image_answered", [
        {"role": "user", "content": IMG + "What digit is this?"},
        {"role": "assistant", "content": "7"}]),
    ("two_images", [
        {"role": "user", "content": IMG + IMG + "Which of the two digits is larger?"}]),
    ("image_with_system_multi_turn", [
        {"role": "system", "content": "You read handwritten digits."},
        {"role": "user", "content": IMG + "What digit?"},
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": IMG + "And this one?"},
        {"role": "assistant", "content": "8"}]),
    ("image_only_no_text", [
        {"role": "user", "content": IMG}]),
    ("image_text_newlines", [
        {"role": "user", "content": IMG + "Line one.\nLine two? 🤔"}]),
    # transformers' tests/models/llava/test_processor_llava.py expects llava-1.5-7b-hf to render
    # this as "USER: <image>\nWhat is shown in this image? ASSISTANT:" (with the generation prompt).
    ("transformers_llava_test", [
        {"role": "user", "content": IMG + "What is shown in this image?"}]),
]


def to_hf(template, messages):
    """mmpost form -> what transformers is given for this template."""
    if template not in MULTIMODAL:
        return [dict(m) for m in messages]
    out = []
    for m in messages:
        text = m["content"]
        items = []
        while text.startswith(IMG):
            items.append({"type": "image"})
            text = text[len(IMG):]
        assert "<image>" not in text, f"image not at the start of the content: {m!r}"
        if text or not items:
            items.append({"type": "text", "text": text})
        out.append({"role": m["role"], "content": items})
    return out


def from_hf(template, hf_messages):
    """HF form -> mmpost form, as mmpost's parse_messages does it (images first as "<image>\\n",
    then the text parts joined by a space); must give back the mmpost messages."""
    if template not in MULTIMODAL:
        return [dict(m) for m in hf_messages]
    out = []
    for m in hf_messages:
        images = "".join(IMG for c in m["content"] if c["type"] == "image")
        texts = " ".join(c["text"] for c in m["content"] if c["type"] == "text")
        out.append({"role": m["role"], "content": images + texts})
    return out


def make_tokenizer(template, chat_template):
    kw = {k: v for k, v in SPECIAL_TOKENS[template].items() if v is not None}
    return PreTrainedTokenizerFast(tokenizer_file=VOCAB, chat_template=chat_template, **kw)


def make_processor(template, tokenizer, chat_template):
    """A real processor for the multimodal templates, or (None, reason)."""
    try:
        if template == "llava":
            from transformers import LlavaProcessor
            try:
                from transformers import CLIPImageProcessorPil as ImageProcessor
            except ImportError:
                from transformers import CLIPImageProcessor as ImageProcessor
            return LlavaProcessor(image_processor=ImageProcessor(), tokenizer=tokenizer,
                                  chat_template=chat_template, patch_size=14,
                                  image_token="<image>"), None
        if template == "qwen2_vl":
            from transformers import Qwen2VLProcessor, Qwen2VLVideoProcessor
            try:
                from transformers import Qwen2VLImageProcessorPil as ImageProcessor
            except ImportError:
                from transformers import Qwen2VLImageProcessor as ImageProcessor
            return Qwen2VLProcessor(image_processor=ImageProcessor(),
                                    video_processor=Qwen2VLVideoProcessor(), tokenizer=tokenizer,
                                    chat_template=chat_template), None
    except Exception as e:  # noqa: BLE001 - optional cross-check only
        return None, (type(e).__name__ + ": " + " ".join(str(e).split()))[:120]
    return None, "text-only template"


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for template in ("smollm2", "qwen2_vl", "llama3", "llava"):
        with open(os.path.join(SRC, template + ".jinja"), encoding="utf-8", newline="") as f:
            chat_template = f.read()
        shutil.copyfile(os.path.join(SRC, template + ".jinja"), os.path.join(OUT, template + ".jinja"))
        tok = make_tokenizer(template, chat_template)
        proc, why = make_processor(template, tok, chat_template)
        special = {k: v for k, v in SPECIAL_TOKENS[template].items() if v is not None}
        assert tok.special_tokens_map == special, (tok.special_tokens_map, special)

        convs = list(TEXT_CONVERSATIONS)
        if template in MULTIMODAL:
            convs += IMAGE_CONVERSATIONS
        variants = [(name, msgs, {}) for name, msgs in convs]
        if template == "qwen2_vl":
            variants += [(name + "_vision_id", msgs, {"add_vision_id": True}) for name, msgs in
                         IMAGE_CONVERSATIONS if name in ("two_images", "image_with_system_multi_turn")]
        n_proc = 0
        for name, msgs, kwargs in variants:
            hf = to_hf(template, msgs)
            assert from_hf(template, hf) == msgs, (template, name)
            for agp in (False, True):
                rendered = tok.apply_chat_template(json.loads(json.dumps(hf)), tokenize=False,
                                                   add_generation_prompt=agp, **kwargs)
                assert isinstance(rendered, str)
                if proc is not None:
                    via_proc = proc.apply_chat_template(json.loads(json.dumps(hf)), tokenize=False,
                                                        add_generation_prompt=agp, **kwargs)
                    assert via_proc == rendered, (template, name, agp, via_proc, rendered)
                    n_proc += 1
                if template == "llava" and name == "transformers_llava_test" and agp:
                    assert rendered == "USER: <image>\nWhat is shown in this image? ASSISTANT:", rendered
                case_ids = {}
                if template == "smollm2":  # what apply_chat_template(tokenize=True) gives
                    case_ids["input_ids"] = tok(rendered, add_special_tokens=False)["input_ids"]
                    assert case_ids["input_ids"] == list(tok.apply_chat_template(
                        json.loads(json.dumps(hf)), tokenize=True, add_generation_prompt=agp,
                        return_dict=True)["input_ids"])
                cases.append({
                    "template": template,
                    "name": name,
                    "messages": msgs,
                    "hf_messages": hf,
                    "add_generation_prompt": agp,
                    "kwargs": kwargs,
                    "special_tokens": special,
                    "image_layout": IMAGE_LAYOUT[template],
                    "rendered": rendered,
                    **case_ids,
                })
        print(f"{template}: {2 * len(variants)} cases"
              + (f", processor cross-check {n_proc} ok" if proc is not None else
                 f", processor cross-check skipped ({why})"))

    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    size = os.path.getsize(os.path.join(OUT, "expected.json"))
    print(f"wrote {len(cases)} cases ({size} bytes) to {OUT} with transformers "
          f"{transformers.__version__}, python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
