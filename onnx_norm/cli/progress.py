"""Progress for long steps (loading a multi-GB model, creating sessions, running both models): shown on stderr
when stderr is a terminal, nothing at all when it is piped or redirected (CI logs, `2> file`) or with -q, and never
on stdout, which keeps only the results."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

#: False with -q (set by the CLI's `main` for the command it runs): no progress, even on a terminal.
shown = True


def progress_console() -> Console:
    """stderr, where progress goes; `is_terminal` says whether to show any (never with -q: `shown`)."""
    console = Console(stderr=True)
    return console if shown else Console(stderr=True, force_terminal=False, force_interactive=False, quiet=True)


@contextlib.contextmanager
def status(text: str) -> Iterator[None]:
    """A spinner with `text` and the elapsed time for the duration of the block, on a terminal only."""
    console = progress_console()
    if not console.is_terminal:
        yield
        return
    with Progress(TextColumn(text), BarColumn(), TimeElapsedColumn(), console=console, transient=True) as bar:
        bar.add_task(text, total=None)
        yield


def rounds_bar() -> Progress:
    """A bar for timed rounds (`update(task, completed, total)`); disabled when stderr is not a terminal. Its task
    reads "loading models and creating sessions" until the first round is done."""
    console = progress_console()
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
