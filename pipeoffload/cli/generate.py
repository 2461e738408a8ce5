"""``pipeoffload generate SRC --prompt TEXT``: continue text from a run's last checkpoint or ``hf:DIR``."""
from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeoffload.cli.common import non_negative_float
from pipeoffload.errors import ConfigError
from pipeoffload.service.argtypes import flag_type
from pipeoffload.service.checks import int_at_least

MAX_TOKENS = 65_536  # more would run for hours on a CPU with nothing shown: a typo, not a request
MAX_SEED = 2**63 - 1  # torch.manual_seed's range


def _tokens(text: str) -> int:
    tokens = int_at_least(text, 1)
    if tokens > MAX_TOKENS:
        raise ValueError(f"{tokens} is more than {MAX_TOKENS:,} tokens; generate fewer")
    return tokens


def _seed(text: str) -> int:
    seed = int_at_least(text, 0)
    if seed > MAX_SEED:
        raise ValueError(f"{seed} is above {MAX_SEED} (2**63 - 1); give a smaller seed")
    return seed


def _utf8(text: str) -> str:
    """The prompt as typed; bytes that are not UTF-8 reach Python as lone surrogates and would fail
    deep in the tokenizer after loading the model."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start].encode("utf-8", "surrogateescape")
        raise ValueError(f"is not valid UTF-8 (byte 0x{bad.hex()} at character {err.start}); "
                         "give the prompt as UTF-8 text") from None
    return text


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "generate", help="continue text from a training run's last checkpoint or hf:DIR",
        description="Continue text from a training run's last checkpoint or hf:DIR, in one process. The context "
                    "kept is the positions the model declares: config.json's max_position_embeddings for hf:DIR "
                    "and runs trained from it (what export --hf writes), no more than a Mistral or Phi-3 folder's "
                    "sliding_window; --seq-len for --model llama and GPT runs. "
                    "Past it only the last that many tokens are kept, positions counted again from 0 (transformers "
                    "keeps the whole text, so the two may differ from there on).")
    parser.add_argument("run_dir", metavar="SRC",
                        help="the --out folder of `pipeoffload train`, or hf:DIR (a local Hugging Face directory)")
    parser.add_argument("--prompt", type=flag_type(_utf8), default="",
                        help="text to continue (UTF-8); none: start from the model's end-of-sequence token "
                             "(hf:DIR and runs trained from it), else a newline")
    parser.add_argument("--tokens", type=flag_type(_tokens), default=100,
                        help=f"tokens to generate, 1 to {MAX_TOKENS:,} (default 100)")
    # None: not given (a sampling flag beside --greedy would do nothing, so it is refused)
    parser.add_argument("--temperature", type=non_negative_float, default=None,
                        help=f"sampling temperature, finite and >= 0; 0: greedy (default {TEMPERATURE:g})")
    parser.add_argument("--seed", type=flag_type(_seed), default=None,
                        help=f"sampling seed, 0 to {MAX_SEED} (default {SEED})")
    parser.add_argument("--greedy", action="store_true",
                        help="always take the most likely token (no sampling: no --temperature or --seed)")
    parser.set_defaults(run=run)


TEMPERATURE, SEED = 0.8, 0


def _sampling(args: argparse.Namespace) -> tuple[float, int]:
    """The temperature and seed to sample with; with ``--greedy`` neither may be given."""
    given = [f"--{name} {value:g}" for name, value in (("temperature", args.temperature), ("seed", args.seed))
             if value is not None]
    if args.greedy and given:
        raise ConfigError(f"--greedy with {' '.join(given)}: greedy decoding does not sample, so "
                          f"{'they have' if len(given) > 1 else 'it has'} no effect; give --greedy or the "
                          "sampling flags, not both")
    return (TEMPERATURE if args.temperature is None else args.temperature,
            SEED if args.seed is None else args.seed)


def _bare_hf_folder(source: str) -> None:
    """Refuse a Hugging Face folder given without ``hf:``, naming the prefix: the run-folder check would ask
    for the config.toml only a run has ("give the --out folder of `pipeoffload train`")."""
    folder = Path(source)
    if (folder / "config.json").is_file() and not (folder / "config.toml").exists():
        raise ConfigError(f"SRC {source!r} is a Hugging Face folder (config.json, no config.toml): give it as "
                          f"hf:{source}")


def run(args: argparse.Namespace) -> int:
    from pipeoffload.cli.common import require_extra, require_run_dir

    temperature, seed = _sampling(args)
    if not args.run_dir.startswith("hf:"):
        _bare_hf_folder(args.run_dir)
        require_run_dir(args.run_dir, checkpoint=True)
    require_extra("torch")
    from pipeoffload.train.generate import Generation

    generation = Generation(args.run_dir, args.prompt, args.tokens, temperature, seed, args.greedy)
    shown = _Shown(live=sys.stdout.isatty())
    with _Interrupts() as interrupts:
        try:
            for _ in generation.steps():
                with interrupts.deferred():
                    shown.update(generation.text)
        except KeyboardInterrupt:  # what came so far is the user's: shown, not dropped
            with interrupts.deferred(then_raise=False):
                shown.finish(generation.text())
            print(f"pipeoffload generate: interrupted after {generation.generated} of {args.tokens} tokens (the "
                  "text so far is above)", file=sys.stderr)
            return 130
    shown.finish(generation.text())
    return 0


class _Interrupts:
    """Ctrl-C (SIGINT) stops the generation at once, but not while text is being written: an interrupt part-way
    through a write would show a piece twice, or not at all. One that comes then is raised right after."""

    def __init__(self) -> None:
        self._writing = self._pending = False

    def __enter__(self) -> _Interrupts:
        self._before = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._before)

    def _on_sigint(self, signum: int, frame: object) -> None:
        if self._writing:
            self._pending = True
        else:
            raise KeyboardInterrupt

    @contextmanager
    def deferred(self, then_raise: bool = True) -> Iterator[None]:
        self._writing = True
        try:
            yield
        finally:
            self._writing = False
            if self._pending and then_raise:
                self._pending = False
                raise KeyboardInterrupt


class _Shown:
    """The text on stdout. At a terminal each token's text is written as it comes (the whole text decoded
    again, and only what extends the part already shown written: a character whose bytes span tokens waits
    for its last byte); elsewhere (a pipe, a file) the whole text once at the end, as decoded."""

    def __init__(self, live: bool) -> None:
        self.live, self.shown = live, ""

    def update(self, text: Callable[[], str]) -> None:
        """After a token: at a terminal, what it adds (``text`` decodes the whole text; not called elsewhere)."""
        if self.live:
            self._extend(text(), final=False)

    def finish(self, text: str) -> None:
        if not self._extend(text, final=True):  # the decoder rewrote what was shown (never seen): the text whole
            sys.stdout.write("\n" + text)
        sys.stdout.write("\n")
        sys.stdout.flush()

    def _extend(self, text: str, final: bool) -> bool:
        """Write what ``text`` adds to the text shown; False where it does not extend it. Until ``final``, a
        trailing U+FFFD (the decoding of a character's bytes not all generated yet) waits."""
        if not text.startswith(self.shown):
            return False
        if not final:
            text = text.rstrip("\ufffd")
        if len(text) > len(self.shown):
            sys.stdout.write(text[len(self.shown):])
            sys.stdout.flush()
            self.shown = text
        return True
