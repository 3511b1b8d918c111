"""Regenerate the checked-in protobuf and gRPC code of every package.

    python tools/gen_proto.py           # rewrite generated files in place
    python tools/gen_proto.py --check   # exit 1 if regenerating would change anything

Each package keeps its `.proto` files under `packages/<pkg>/proto/` in folders that mirror the
Python package (`dlrover/<pkg>/v1/x.proto` becomes `dlrover.<pkg>.v1.x_pb2`). Every package's
proto folder is on the include path, so one package's messages may import another's.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc  # imported here: only this tool needs grpcio-tools

    include = str(Path(protoc.__file__).parent / "_proto")
    code = protoc.main(["grpc_tools.protoc", f"-I{include}", *args])
    if code != 0:
        raise SystemExit(f"protoc failed ({code}) for {args[-1]}")


def generate(out_root: Path) -> list[Path]:
    """Generate code for every package into `out_root/<pkg>/src`; returns the files written."""
    proto_dirs = sorted(p for p in (ROOT / "packages").glob("*/proto") if any(p.rglob("*.proto")))
    includes = [f"-I{d}" for d in proto_dirs]
    written: list[Path] = []
    for proto_dir in proto_dirs:
        out = out_root / proto_dir.parent.name / "src"
        out.mkdir(parents=True, exist_ok=True)
        for proto in sorted(proto_dir.rglob("*.proto")):
            _protoc([*includes, f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", str(proto)])
            rel_dir = proto.parent.relative_to(proto_dir)
            init = out / rel_dir / "__init__.py"
            init.write_text('"""Generated protobuf and gRPC code (tools/gen_proto.py); do not edit."""\n')
            written.append(init)
        written.extend(p for p in out.rglob("*") if p.name.endswith(GENERATED_SUFFIXES))
    return sorted(set(written))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the checked-in code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
        stale: list[str] = []
        for fresh in files:
            rel = fresh.relative_to(tmp)
            target = ROOT / "packages" / rel
            if target.exists() and filecmp.cmp(fresh, target, shallow=False):
                continue
            stale.append(str(Path("packages") / rel))
            if not args.check:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(fresh, target)
    if args.check and stale:
        print("generated protobuf code is stale; run `nox -s proto`:\n  " + "\n  ".join(stale))
        return 1
    print(f"{len(stale)} generated file(s) {'would change' if args.check else 'rewritten'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
