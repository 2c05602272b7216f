"""What the tests of examples/ share: a tiny multi30k-shaped corpus and running an example's script."""
import gzip
import os
import random
import subprocess
import sys

from .cli import env

WORDS = {"en": "the a dog cat runs sits on under red small".split(),
         "de": "der die hund katze läuft sitzt auf unter rot klein".split()}


def write_multi30k(d):
    """d/{train,val,test_2016_flickr}.{en,de}.gz: 120 / 20 / 20 sentences of 3 to 8 words over ten per language
    (the layout of Multi30k's raw text, which the examples' prepare.py read)."""
    rng = random.Random(0)
    for name, n in (("train", 120), ("val", 20), ("test_2016_flickr", 20)):
        for lang, words in WORDS.items():
            with gzip.open(os.path.join(d, f"{name}.{lang}.gz"), "wt", encoding="utf-8") as f:
                f.writelines(" ".join(rng.choices(words, k=rng.randint(3, 8))) + "\n" for _ in range(n))


def run_example(cmd, cwd, timeout=300, **extra):
    """Runs an example's script (PYTHON = this interpreter, `extra` in the environment); returns its stdout."""
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=env(PYTHON=sys.executable, **extra))
    assert r.returncode == 0, (cmd, r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout
