"""--check-args for the benchmark scripts: the rehearsal of scripts/gpu_check.sh (GPU_CHECK_REHEARSE=1,
docs/gpu_check.md) runs every benchmark's exact GPU command line with this flag on a machine without a
GPU. The script parses and validates its arguments as it would there (except that a CUDA device is
not required), writes a stub JSON marked as a rehearsal where --json names a file, and exits 0 without
measuring anything."""
import json
import sys

FLAG = "--check-args"


def add(parser) -> None:
    parser.add_argument(FLAG, action="store_true", help="only parse and validate the arguments (no CUDA "
                        "device needed), write a stub JSON marked as a rehearsal at --json, exit 0")


def finish(args, script: str) -> None:
    """Exits 0 after the validation when --check-args was given; returns otherwise."""
    if not args.check_args:
        return
    path = getattr(args, "json", None)
    if path:
        with open(path, "w") as f:
            json.dump({"rehearsal": True, "script": script, "argv": sys.argv[1:]}, f, indent=1)
    print(f"{script}: arguments OK ({FLAG}: nothing measured{', stub JSON at ' + path if path else ''})")
    sys.exit(0)
