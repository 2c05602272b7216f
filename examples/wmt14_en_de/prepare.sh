#!/usr/bin/env bash
# WMT14 English-German for fairseq: raw text -> cleaned, joint sentencepiece subwords -> fairseq-preprocess.
#
#   prepare.sh RAW_DIR_OR_EMPTY OUT_DIR
#
# RAW_DIR_OR_EMPTY: a directory holding {train,valid,test}.{en,de} (untokenised, one sentence per line),
#   or "" to download WMT14 En-De from the sources fairseq's examples/translation/prepare-wmt14en2de.sh
#   uses (Europarl v7 + Common Crawl + News Commentary v12 for training, newstest2013 for validation,
#   newstest2014 (full, 3003 sentences) for test) into OUT_DIR/orig and extract it to OUT_DIR/raw.
# OUT_DIR gets: raw/ (downloads only), spm/{spm.model,spm.vocab,train,valid,test.*}, data-bin/.
#
# Environment: VOCAB_SIZE (32000), SRC (en), TGT (de), WORKERS (number of CPUs), PYTHON (python),
#   CLEAN_RATIO (1.5), CLEAN_MAX_LEN (250 pieces): see README.md.
set -euo pipefail

if [ $# -ne 2 ]; then
    sed -n '2,13p' "$0" >&2
    exit 2
fi
RAW_IN=$1
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python}
SRC=${SRC:-en}
TGT=${TGT:-de}
VOCAB_SIZE=${VOCAB_SIZE:-32000}
WORKERS=${WORKERS:-$(nproc 2>/dev/null || echo 1)}

fetch() {  # fetch URL FILE: download unless already there
    if [ -s "$2" ]; then echo "prepare.sh: $2 already downloaded"; return; fi
    echo "prepare.sh: downloading $1"
    if command -v curl >/dev/null; then curl -fL --retry 3 -o "$2.part" "$1"; else wget -q -O "$2.part" "$1"; fi
    mv "$2.part" "$2"
}

if [ -z "$RAW_IN" ]; then
    [ "$SRC-$TGT" = "en-de" ] || { echo "prepare.sh: the download is En-De; set SRC=en TGT=de" >&2; exit 2; }
    ORIG=$OUT/orig
    RAW=$OUT/raw
    mkdir -p "$ORIG" "$RAW"
    URLS=(
        "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"
        "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"
        "http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz"
        "http://data.statmt.org/wmt17/translation-task/dev.tgz"
        "http://statmt.org/wmt14/test-full.tgz"
    )
    for url in "${URLS[@]}"; do
        file=$ORIG/$(basename "$url")
        fetch "$url" "$file"
        tar -C "$ORIG" -xzf "$file"
    done
    CORPORA=(training/europarl-v7.de-en commoncrawl.de-en training/news-commentary-v12.de-en)
    for l in en de; do
        : > "$RAW/train.$l"
        for c in "${CORPORA[@]}"; do cat "$ORIG/$c.$l" >> "$RAW/train.$l"; done
        cp "$ORIG/dev/newstest2013.$l" "$RAW/valid.$l"
        # newstest2014 (full): the <seg> contents of the sgm files, as fairseq's script extracts them
        if [ "$l" = en ]; then t=src; else t=ref; fi
        grep '<seg id' "$ORIG/test-full/newstest2014-deen-$t.$l.sgm" \
            | sed -e 's/<seg id="[0-9]*">\s*//g' -e 's/\s*<\/seg>\s*//g' -e "s/\’/\'/g" > "$RAW/test.$l"
    done
else
    RAW=$(cd "$RAW_IN" && pwd)
fi
for split in train valid test; do
    for l in "$SRC" "$TGT"; do
        [ -s "$RAW/$split.$l" ] || { echo "prepare.sh: missing or empty $RAW/$split.$l" >&2; exit 1; }
    done
    n_src=$(wc -l < "$RAW/$split.$SRC"); n_tgt=$(wc -l < "$RAW/$split.$TGT")
    [ "$n_src" = "$n_tgt" ] || { echo "prepare.sh: $RAW/$split.$SRC has $n_src lines, $RAW/$split.$TGT $n_tgt" >&2; exit 1; }
done

echo "prepare.sh: sentencepiece (joint, $VOCAB_SIZE pieces), encode, clean the training pairs"
"$PYTHON" "$HERE/spm_encode.py" "$RAW" "$OUT/spm" --src "$SRC" --tgt "$TGT" --vocab-size "$VOCAB_SIZE" \
    --ratio "${CLEAN_RATIO:-1.5}" --max-len "${CLEAN_MAX_LEN:-250}" --threads "$WORKERS"

echo "prepare.sh: fairseq-preprocess --joined-dictionary"
rm -rf "$OUT/data-bin"
"$PYTHON" -m fairseq_cli.preprocess --source-lang "$SRC" --target-lang "$TGT" \
    --trainpref "$OUT/spm/train" --validpref "$OUT/spm/valid" --testpref "$OUT/spm/test" \
    --destdir "$OUT/data-bin" --joined-dictionary --workers "$WORKERS"
cp "$OUT/spm/spm.model" "$OUT/data-bin/spm.model"
echo "prepare.sh: done. data: $OUT/data-bin  sentencepiece model: $OUT/spm/spm.model  test reference: $RAW/test.$TGT"
