"""Cut a file into the parts that device calls carry (bench/gpu_check.sh prepare).

Every call carries the checkout, so a part may hold ``part_bytes`` (what the checkout leaves
of a call); the last call also carries ``extra_bytes`` of data, so the last part holds at most
``part_bytes - extra_bytes``, and the first carries ``first_extra_bytes`` (the wheels, and the
heads folders when the checkout leaves them out), so the first holds at most
``part_bytes - first_extra_bytes``. At least two parts: the first call runs on its own.

    python bench/model_parts.py FILE PART_BYTES EXTRA_BYTES OUT_DIR [FIRST_EXTRA_BYTES]
        -> OUT_DIR/part1/model.part-00, OUT_DIR/part2/model.part-01, ...; prints the count
"""

from __future__ import annotations

import sys
from pathlib import Path


def part_sizes(total: int, part_bytes: int, extra_bytes: int,
               first_extra_bytes: int = 0) -> list[int]:
    """Sizes of the parts of a ``total``-byte file, in order: the first within
    ``part_bytes - first_extra_bytes``, full parts, then whatever leaves the last within
    ``part_bytes - extra_bytes``; the fewest parts that fit (at least two)."""
    last_room = part_bytes - extra_bytes
    first_room = part_bytes - first_extra_bytes
    if total < 2 or last_room < 1 or first_room < 1:
        raise ValueError(f"cannot cut {total} bytes into parts of {part_bytes} with "
                         f"{first_extra_bytes} kept free in the first and {extra_bytes} in "
                         "the last")
    sizes: list[int] = []
    rest = total
    while rest > last_room or not sizes:
        room = first_room if not sizes else part_bytes
        sizes.append(min(room, max(rest - last_room, 1)))
        rest -= sizes[-1]
    sizes.append(rest)
    return sizes


def write_parts(path: Path, part_bytes: int, extra_bytes: int, out_dir: Path,
                first_extra_bytes: int = 0) -> int:
    data = path.read_bytes()
    start = 0
    sizes = part_sizes(len(data), part_bytes, extra_bytes, first_extra_bytes)
    for k, size in enumerate(sizes, start=1):
        folder = out_dir / f"part{k}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"model.part-{k - 1:02d}").write_bytes(data[start:start + size])
        start += size
    return len(sizes)


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__.strip().splitlines()[-2].strip(), file=sys.stderr)
        return 2
    try:
        first_extra = int(argv[4]) if len(argv) == 5 else 0
        print(write_parts(Path(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3]), first_extra))
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
