#!/usr/bin/env python3
"""A mixed-length SFT set from the bundled digits (issue 14's packing benchmark).

Each digit-train record becomes a conversation of 1 to 6 question/answer turns about its image
(the first turn asks for the digit, later ones ask for a check, its parity or a spelled-out
answer), so sample lengths spread over about 4x while every record keeps one image.
Usage: make_mixed_digits.py OUT_DIR  -> OUT_DIR/train.jsonl (absolute image paths)
"""
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = os.path.join(ROOT, "data", "digits-vqa")
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def turns_for(d, n, rng):
    out = []
    follow = [
        ("Are you sure?", f"Yes, the image shows the digit {d}."),
        ("Is it even or odd?", f"{d} is {'even' if d % 2 == 0 else 'odd'}."),
        ("Spell it out.", f"It is {WORDS[d]}."),
        ("What is it plus one?", f"{d} plus one is {d + 1}."),
        ("Describe the image briefly.", f"A small handwritten {WORDS[d]} on a dark background."),
    ]
    rng.shuffle(follow)
    for q, a in follow[: n - 1]:
        out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return out


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(0)
    n = 0
    with open(os.path.join(DIGITS, "train.jsonl")) as f, \
            open(os.path.join(out_dir, "train.jsonl"), "w") as g:
        for line in f:
            rec = json.loads(line)
            d = int(rec["messages"][1]["content"])
            msgs = rec["messages"][:2] + turns_for(d, rng.randint(1, 6), rng)
            rec["messages"] = msgs
            rec["images"] = [os.path.join(DIGITS, p) for p in rec["images"]]
            g.write(json.dumps(rec) + "\n")
            n += 1
    print(f"{n} records -> {out_dir}/train.jsonl", file=sys.stderr)


if __name__ == "__main__":
    main()
