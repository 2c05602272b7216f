"""What the examples' results.py share: fairseq's json log rows, and the ls-against-native table over seeds.

An example's results.py defines results(OUT_DIR, ...) -> {name: number or None} and calls main(results, KEYS):

    python results.py OUT_DIR [ARGS]                         # one run: results(OUT_DIR, ARGS) as JSON
    python results.py --compare LS_DIR... -- NATIVE_DIR...  # per key: mean, std, values and the mean difference
"""
import json
import statistics
import sys


def json_rows(path, tag):
    """The json objects of fairseq's `--log-format json` lines tagged `| TAG |` (train, valid, ...) in PATH."""
    rows = []
    with open(path) as f:
        for line in f:
            if f"| {tag} |" in line and "{" in line:
                rows.append(json.loads(line[line.index("{"):]))
    return rows


def compare(results, keys, ls_dirs, native_dirs):
    """Prints a line per key; a key that some run has as None (not measured) is left out."""
    ls, native = [results(d) for d in ls_dirs], [results(d) for d in native_dirs]
    for key in keys:
        a, b = [r[key] for r in ls], [r[key] for r in native]
        if None in a + b:
            continue
        sd = (lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0)
        print(f"{key}: ls {statistics.mean(a):.4f} +- {sd(a):.4f} {a} | native {statistics.mean(b):.4f} +- "
              f"{sd(b):.4f} {b} | mean difference {statistics.mean(a) - statistics.mean(b):+.4f}")


def main(results, keys, argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[0] == "--compare":
        i = argv.index("--")
        compare(results, keys, argv[1:i], argv[i + 1:])
    else:
        print(json.dumps(results(*argv)))
