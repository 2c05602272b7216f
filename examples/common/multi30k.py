"""What the examples' prepare.py share: Multi30k's raw text in, plain text files and fairseq-preprocess out.

MULTI30K_DIR holds {train,val,test_2016_flickr}.{en,de}.gz; SPLITS maps fairseq's split names to those.
The fairseq tools are taken from the interpreter's directory (the venv that has fairseq).
"""
import gzip
import os
import subprocess
import sys

SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
BIN = os.path.dirname(sys.executable)


def read(multi30k_dir, name, lang):
    """The stripped lines of MULTI30K_DIR/NAME.LANG.gz."""
    with gzip.open(os.path.join(multi30k_dir, f"{name}.{lang}.gz"), "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def write(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def preprocess(out, *args):
    """fairseq-preprocess ARGS in the folder OUT (2 workers); raises on failure."""
    subprocess.run([os.path.join(BIN, "fairseq-preprocess"), "--workers", "2", *args], cwd=out, check=True)
