"""`fsage workload generate|show`: make a deterministic op stream from a profile, look at one."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import click

from fsage.ager import parse_bytes
from fsage.ager.generator import Generator
from fsage.ager.githistory import git_stream
from fsage.ager.profile import load_profile
from fsage.ager.runstart import shape_profile
from fsage.cli.common import echo_json, echo_table, format_option
from fsage.workload import Op, read_workload, write_workload

_output_option = click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Output file (.gz: gzip; '-': standard output, the summary then goes to stderr).",
)


@click.group()
def workload() -> None:
    """Make and inspect workloads (op streams as JSON Lines, optionally gzipped).

    \b
    Examples:
      fsage workload generate --profile hfs-surge --seed 1 --capacity 1G -o ops.jsonl.gz
      fsage workload show ops.jsonl.gz
    """


@workload.command()
@click.option(
    "--profile",
    "profile_spec",
    required=True,
    help="Preset (hfs-surge, impressions, hfs-aging, random-update, prefragment, desktop, news, "
    "vcs, database...), a JSON profile file, or a Geriatrix profile directory.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option(
    "--capacity",
    required=True,
    help="Capacity of the target in bytes; K, M, G, T are binary multiples (512M = 512 MiB, "
    "4G = 4 GiB).",
)
@_output_option
@click.option("--fill", type=float, help="Fullness to fill to (0-1).")
@click.option("--churn", type=float, help="Churn until this many times the capacity is written.")
@click.option("--ops-limit", type=int, help="Stop after this many ops.")
@click.option(
    "--block-size",
    type=int,
    default=4096,
    show_default=True,
    help="Block size of the capacity model.",
)
@format_option("text", "json")
def generate(
    profile_spec: str, seed: int, capacity: str, output: Path, fill: float | None,
    churn: float | None, ops_limit: int | None, block_size: int, fmt: str,
) -> None:  # fmt: skip
    """Generate an op stream for a target of CAPACITY bytes.

    The same profile, seed and capacity always give a byte-identical file: the generator
    tracks its own model of the blocks in use and never looks at a real target.

    \b
    Examples:
      fsage workload generate --profile hfs-surge --seed 7 --capacity 512M -o ops.jsonl
      fsage workload generate --profile random-update --capacity 1G --fill 0.6 -o ru.jsonl.gz
    """
    profile = shape_profile(load_profile(profile_spec), fill=fill, churn=churn, ops_limit=ops_limit)
    gen = Generator(profile, seed, parse_bytes(capacity), block_size=block_size)
    count = write_workload(output, gen.header(), gen.ops())
    st = gen.stats
    out = {
        "output": str(output),
        "ops": count,
        "bytes_written": st.bytes_written,
        "fill_ops": st.fill_ops,
        "model_fullness": round(gen.fullness(), 4),
        "counts": dict(sorted(st.counts.items())),
    }
    to_stderr = str(output) == "-"
    if fmt == "json":
        click.echo(json.dumps(out, indent=2), err=to_stderr)
    else:
        click.echo(
            f"{output}: {count} ops, {st.bytes_written / 2**20:,.1f} MiB written, "
            f"model fullness {gen.fullness():.3f}",
            err=to_stderr,
        )


@workload.command()
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@format_option("text", "json")
def show(path: Path, fmt: str) -> None:
    """Print a workload's header and its op counts.

    \b
    Examples:
      fsage workload show ops.jsonl.gz --format json
    """
    header, ops = read_workload(path)
    counts: Counter[str] = Counter()
    written = 0
    for op in ops:
        counts[op.op] += 1
        if op.op in ("create", "append", "overwrite"):
            written += op.size
    if fmt == "json":
        echo_json({"header": header.__dict__, "counts": dict(sorted(counts.items())),
                   "bytes_written": written})  # fmt: skip
        return
    click.echo(f"generator {header.generator}, seed {header.seed}, fsage {header.fsage_version}")
    echo_table(["op", "count"], sorted(counts.items()))
    click.echo(f"{sum(counts.values())} ops, {written / 2**20:,.1f} MiB of data written")


@click.command("git")
@click.argument("repo", type=click.Path(path_type=Path))
@click.option("--trees", type=int, default=1, show_default=True, help="Work trees (tree0..).")
@click.option("--every", type=int, default=1, show_default=True, help="Commits each pull brings.")
@click.option("--steps", type=int, help="Stop after this many pulls (default: the whole history).")
@click.option(
    "--offset",
    type=int,
    default=0,
    show_default=True,
    help="Tree i follows tree 0 this many commits times i behind.",
)
@click.option(
    "--first-parent/--all-commits",
    default=True,
    show_default=True,
    help="Follow first parents only, or every commit in topological order.",
)
@click.option("--rev", default="HEAD", show_default=True, help="The commit whose history to pull.")
@_output_option
@format_option("text", "json")
def git_command(
    repo: Path, trees: int, every: int, steps: int | None, offset: int, first_parent: bool,
    rev: str, output: Path, fmt: str,
) -> None:  # fmt: skip
    """Turn REPO's history into the ops of pulling it into work trees, pull after pull.

    Each step pulls EVERY commits into every tree in turn (a snapshot marker after it), and
    each pull is written as git checks out: changed files unlinked and created anew, in
    path order. Run the stream with `fsage age TARGET --ops FILE`.

    \b
    Examples:
      fsage workload git ~/src/project --trees 4 --every 10 -o git.jsonl.gz
      fsage age /mnt/test --ops git.jsonl.gz
    """
    header, ops = git_stream(
        repo, trees=trees, every=every, steps=steps, offset=offset, first_parent=first_parent,
        rev=rev,
    )  # fmt: skip
    counts: Counter[str] = Counter()
    written = 0

    def counted() -> Iterator[Op]:
        nonlocal written
        for op in ops:
            counts[op.op] += 1
            if op.op == "create":
                written += op.size
            yield op

    count = write_workload(output, header, counted())
    p = header.params
    to_stderr = str(output) == "-"
    if fmt == "json":
        out = {"output": str(output), "ops": count, "bytes_written": written,
               "counts": dict(sorted(counts.items())), "header": header.__dict__}  # fmt: skip
        click.echo(json.dumps(out, indent=2), err=to_stderr)
        return
    click.echo(
        f"{output}: {p['steps']} steps of {p['every']} commits into {p['trees']} trees "
        f"({p['commits']} commits), {count} ops, {written / 2**20:,.1f} MiB written",
        err=to_stderr,
    )


workload.add_command(git_command)

COMMANDS = [workload]
