"""Every setting of one generation, in one place (docs/generation.md#generation-settings).

``GenerationParams`` is what a generation runs under. The Python API
builds it from keywords (``from_keywords``), a `gemma-cy batch` line from
its JSON object (``from_json``), the CLI from its flags (``cli_flags`` and
``from_flags``), the server from a request body (its ``to_params``), and
every one of them is checked when built: a value out of range never
reaches a generation, and no other module keeps a list of the settings.

Each field's metadata says where it may come from: ``data`` (False for
Python objects: callables, a random stream, an observer, a draft model,
which no JSON line or request can carry) and ``flags`` (the CLI's names
for it, with ``help``; none: the CLI sets it its own way or not at all).
What depends on the model (the prompt fits the context, the grammar
compiles for its vocabulary, a draft model shares it) is the model's
check, ``Model.check``.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ParameterError, UnknownSettingError
from .constraint import CONSTRAINT_KEYWORDS, ConstraintSpec, constraint_spec
from .logprobs import check_top_logprobs
from .penalties import DEFAULT_REPEAT_LAST_N, Penalties
from .sampling import DEFAULT_MIN_P, DEFAULT_TEMPERATURE, Sampler
from .speculative import check_draft_max, check_speculative
from .stops import check_stop_strings

DEFAULT_MAX_TOKENS = 250


def check_max_tokens(max_tokens) -> int:
    """``max_tokens`` (the seed's ``n_dec``), or ParameterError."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ParameterError(f"max_tokens = {max_tokens!r}, must be an integer >= 0")
    return max_tokens


def check_processors(logits_processor) -> tuple:
    """None, one callable or a sequence of callables -> a tuple of callables."""
    if logits_processor is None:
        return ()
    procs = (logits_processor,) if callable(logits_processor) else tuple(logits_processor)
    if not all(callable(p) for p in procs):
        raise ParameterError(f"logits_processor must be a callable or a list of callables, "
                             f"got {logits_processor!r}")
    return procs


def setting(default, help: str = "", flags: tuple[str, ...] = (), data: bool = True, **flag_options):
    """A field of GenerationParams: its default, and where it may be set
    from (``flags``: the CLI's names; ``flag_options``: argparse's, the
    flag's type given by the field's own; ``data``: a JSON value)."""
    return field(default=default, metadata={"help": help, "flags": flags, "data": data, "options": flag_options})


@dataclass(frozen=True)
class GenerationParams:
    """The settings of one generation (docs/generation.md#python-api), checked when built."""

    max_tokens: int = setting(DEFAULT_MAX_TOKENS, f"tokens to generate (default {DEFAULT_MAX_TOKENS})",
                              ("-n", "--n_dec", "--max_tokens"))
    temperature: float = setting(DEFAULT_TEMPERATURE, f"temperature; 0 = greedy (default {DEFAULT_TEMPERATURE})",
                                 ("--temp", "--temperature"))
    min_p: float = setting(DEFAULT_MIN_P, f"Min-P in [0, 1]; 0 = off (default {DEFAULT_MIN_P})",
                           ("--minp", "--min_p"))
    top_k: int = setting(0, "keep the k most likely tokens (default 0 = off)", ("--topk", "--top_k"))
    top_p: float = setting(1.0, "nucleus sampling mass in (0, 1] (default 1 = off)", ("--topp", "--top_p"))
    repeat_penalty: float = setting(1.0, "divide positive / multiply negative logits of recent tokens "
                                         "(default 1 = off)", ("--repeat_penalty",))
    presence_penalty: float = setting(0.0, "subtract from the logits of recent tokens (default 0 = off)",
                                      ("--presence_penalty",))
    frequency_penalty: float = setting(0.0, "subtract times the count of each recent token (default 0 = off)",
                                       ("--frequency_penalty",))
    repeat_last_n: int = setting(DEFAULT_REPEAT_LAST_N, "how many recent tokens the penalties look at "
                                                        f"(default {DEFAULT_REPEAT_LAST_N})", ("--repeat_last_n",))
    seed: int = setting(0, "sampler seed (SplitMix64), default 0", ("-s", "--seed"))
    stop: tuple[str, ...] = setting((), "end the text where TEXT appears (not printed); repeatable", ("--stop",),
                                    action="append", metavar="TEXT")
    terminate_on_eos: bool = setting(True, "stop at <eos>/<end_of_turn> (default 1)", ("--terminate_on_eos",),
                                     choices=(0, 1))
    logprobs: int | None = setting(None)  # k: each id's log-probability and the k likeliest alternatives'
    speculative: str | None = setting(None)  # "lookup": draft by prompt lookup (the CLI's --draft)
    draft_max: int | None = setting(None, "ids drafted at most per block (default 7)", ("--draft_max",))
    # structured output, at most one (docs/structured_output.md; the CLI has its own flags)
    response_format: dict | None = setting(None)
    json_schema: dict | str | None = setting(None)
    regex: str | None = setting(None)
    grammar: str | None = setting(None)
    choices: tuple[str, ...] | None = setting(None)
    # Python objects: never from JSON
    rng: Any = setting(None, data=False)  # a SplitMix64 stream to draw from and advance instead of seed's
    logits_processor: Callable | tuple[Callable, ...] | None = setting(None, data=False)
    accept_token: Callable[[int], bool] | None = setting(None, data=False)
    observer: Any = setting(None, data=False)
    draft: Any = setting(None, data=False)  # a Model of the same vocabulary drafting for this one

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """ParameterError naming the first setting out of range (called when built)."""
        set_ = functools.partial(object.__setattr__, self)
        set_("max_tokens", check_max_tokens(self.max_tokens))
        set_("stop", check_stop_strings(self.stop))
        set_("logits_processor", check_processors(self.logits_processor) or None)
        if self.accept_token is not None and not callable(self.accept_token):
            raise ParameterError(f"accept_token must be a callable (id -> bool), got {self.accept_token!r}")
        if not isinstance(self.terminate_on_eos, bool):
            if self.terminate_on_eos not in (0, 1):
                raise ParameterError(f"terminate_on_eos = {self.terminate_on_eos!r}, must be true or false")
            set_("terminate_on_eos", bool(self.terminate_on_eos))
        if self.choices is not None and isinstance(self.choices, list):
            set_("choices", tuple(self.choices))
        self.sampler()
        self.penalties()
        check_top_logprobs(self.logprobs)
        if self.draft is None:
            check_speculative(self.speculative, self.draft_max)
        else:
            if self.speculative is not None:
                raise ParameterError("speculative and draft: give one (speculative='lookup' or draft=Model)")
            if self.draft_max is not None:
                check_draft_max(self.draft_max)
        self.constraint_spec  # noqa: B018 - checks the one constraint (and caches it)

    @classmethod
    def from_keywords(cls, keywords: dict, base: "GenerationParams | None" = None) -> "GenerationParams":
        """``base`` (default: the defaults) with ``keywords`` set; ``n_dec``
        is the seed engine's name for ``max_tokens``. UnknownSettingError
        (a TypeError) for a keyword that is no setting."""
        keywords = dict(keywords)
        if "n_dec" in keywords:
            n_dec = keywords.pop("n_dec")
            if keywords.get("max_tokens", n_dec) != n_dec:
                raise ParameterError(f"max_tokens = {keywords['max_tokens']!r} and n_dec = {n_dec!r}: give one")
            keywords["max_tokens"] = n_dec
        if keywords.get("max_tokens", 0) is None:  # None: the default
            del keywords["max_tokens"]
        unknown = sorted(set(keywords) - set(FIELDS))
        if unknown:
            raise UnknownSettingError(f"unknown keyword {unknown[0]!r}")
        if base is None:
            return cls(**keywords)
        return dataclasses.replace(base, **keywords) if keywords else base

    @classmethod
    def from_json(cls, obj: dict) -> "GenerationParams":
        """The settings of a JSON object (a `gemma-cy batch` line less its
        prompt): only data settings; ParameterError naming an unknown key."""
        unknown = sorted(set(obj) - set(DATA_FIELDS))
        if unknown:
            raise ParameterError(f"unknown key {unknown[0]!r}")
        return cls.from_keywords(obj)

    @classmethod
    def from_flags(cls, args, **extra) -> "GenerationParams":
        """The settings the CLI's flags give (``cli_flags``), plus ``extra``."""
        return cls(**{**{name: getattr(args, name) for name in FLAG_FIELDS}, **extra})

    def replace(self, **changes) -> "GenerationParams":
        """A copy with ``changes`` set, checked."""
        return dataclasses.replace(self, **changes)

    def for_sample(self, k: int) -> "GenerationParams":
        """Sample ``k`` of several of one prompt: it draws from seed + k."""
        return self if k == 0 else self.replace(seed=(self.seed + k) % 2**64)

    def sampler(self) -> Sampler:
        return Sampler(temperature=self.temperature, min_p=self.min_p, top_k=self.top_k, top_p=self.top_p,
                       seed=self.seed, rng=self.rng)

    def penalties(self) -> Penalties:
        return Penalties(self.repeat_penalty, self.presence_penalty, self.frequency_penalty, self.repeat_last_n)

    @functools.cached_property
    def constraint_spec(self) -> ConstraintSpec | None:
        """The structured-output constraint asked for (None: none)."""
        return constraint_spec(**{k: getattr(self, k) for k in CONSTRAINT_KEYWORDS})

    def data(self) -> dict:
        """The data settings that differ from the defaults, as JSON values."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["data"] and value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


FIELDS = tuple(f.name for f in dataclasses.fields(GenerationParams))
DATA_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationParams) if f.metadata["data"])
FLAG_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationParams) if f.metadata["flags"])


def cli_flags() -> list[tuple[tuple[str, ...], dict]]:
    """(names, argparse options) of each setting the CLI takes, its type
    and default the field's (``dest`` the field's name)."""
    out = []
    for f in dataclasses.fields(GenerationParams):
        if not f.metadata["flags"]:
            continue
        options = {"dest": f.name, "help": f.metadata["help"], **f.metadata["options"]}
        if options.get("action") == "append":
            options["default"] = None
        else:
            options["default"] = int(f.default) if isinstance(f.default, bool) else f.default
            options["type"] = float if "float" in str(f.type) else int
        out.append((f.metadata["flags"], options))
    return out
