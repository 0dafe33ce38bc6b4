"""Speed-ups for TextWorld's PDDL engine: no pure work redone, no needless deep copies.

As shipped, the engine spends almost all of its time on three things:

* Fast Downward's ``pddl2sas`` translation of the game's PDDL problem, twice per
  ``PddlState`` (the state task and an optimized one for replanning), and a
  ``PddlState`` is built on every ``load`` and every ``reset``: four translations,
  0.3-2 s, before a game's first observation, and two more on each replay;
* TatSu parses of grammar text: the game's grammar document on ``load``, every
  ``#symbol#`` string and every rule condition on every ``derive`` (each reset and step
  derives the feedback and one command per admissible action);
* ``textgen.copy_context``, which deep-copies the entity infos and variables of the
  derivation context for every symbol derived (about 60% of a step once parses are cached).

:func:`engine_speedups` changes each while it is active. Translations and parses are
served from caches: each is a pure function of its text arguments, so a cached result is
what the call would have returned (parses come back as deep copies, since the engine
assigns contexts to the symbols it derives). Translations are also kept on disk
(``<cache>/alfworld_translations``, about 50 KB a game, keyed by a hash of the domain,
problem, options, Python and Fast Downward versions), shared by every process and later
run. ``copy_context`` copies the two dicts instead of their content: a derivation adds
entries to a context's ``variables`` and ``mapping`` (rule queries, list symbols) but
only reads the objects in them (the grammar's ``{o.name}``-style expressions are
attribute reads), so a copy of each dict isolates contexts as the deep copy did.
Everything is patched only inside the ``with`` block; code outside it runs the engine as
shipped, and the tests compare whole episodes against that.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import pickle
import sys
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from copy import deepcopy
from functools import lru_cache
from pathlib import Path
from typing import Any

import fast_downward
import textworld.envs.pddl.logic as pddl_logic
import textworld.envs.pddl.textgen as textgen
import textworld.logic as tw_logic

from hp_agent.files import atomic_write_bytes
from hp_agent.paths import cache_root

log = logging.getLogger(__name__)

TRANSLATIONS_DIRNAME = "alfworld_translations"
# Translations held in memory per process (about 2.6 MB each); the disk keeps them all.
TRANSLATIONS_IN_MEMORY = 64
_FAST_DOWNWARD_VERSION = importlib.metadata.version("fast_downward_textworld")


class TranslationCache:
    """``fast_downward.pddl2sas`` results by content, in memory (LRU) and optionally on disk.

    directory: where translations are stored as zlib-compressed pickles (None: memory
               only). Files are written atomically and a file that cannot be read is
               translated again and replaced, so concurrent writers and crashes are harmless.
    """

    def __init__(self, directory: Path | None, in_memory: int = TRANSLATIONS_IN_MEMORY,
                 translate: Callable[..., tuple[Any, str]] = fast_downward.pddl2sas):
        self.directory = directory
        self.in_memory = in_memory
        self._translate = translate
        self._memory: OrderedDict[str, tuple[Any, str]] = OrderedDict()
        self.translated = self.from_disk = self.from_memory = 0  # counts, for tests and benchmarks

    def __call__(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> tuple[Any, str]:
        """What ``fast_downward.pddl2sas(domain, problem, verbose, optimize)`` returns."""
        key = hashlib.sha256(f"{_FAST_DOWNWARD_VERSION}\0{sys.version_info[:2]}\0{optimize}\0{domain}\0{problem}".encode()).hexdigest()
        if key in self._memory:
            self._memory.move_to_end(key)
            self.from_memory += 1
            return self._memory[key]
        result = self._read(key)
        if result is None:
            result = self._translate(domain, problem, verbose=verbose, optimize=optimize)
            self.translated += 1
            self._write(key, result)
        else:
            self.from_disk += 1
        self._memory[key] = result
        if len(self._memory) > self.in_memory:
            self._memory.popitem(last=False)
        return result

    def _path(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / key[:2] / f"{key}.pkl.z"

    def _read(self, key: str) -> tuple[Any, str] | None:
        if self.directory is None:
            return None
        path = self._path(key)
        try:
            return pickle.loads(zlib.decompress(path.read_bytes()))
        except FileNotFoundError:
            return None
        except Exception as error:  # torn or foreign file: translate again and replace it
            log.warning("ignoring unreadable cached translation %s (%s)", path, error)
            return None

    def _write(self, key: str, result: tuple[Any, str]) -> None:
        if self.directory is None:
            return
        try:
            atomic_write_bytes(self._path(key), zlib.compress(pickle.dumps(result, pickle.HIGHEST_PROTOCOL), 1))
        except OSError as error:  # a full or read-only disk costs speed, never the episode
            log.warning("could not store a translation in %s (%s)", self.directory, error)


_default_translations: TranslationCache | None = None


def default_translations() -> TranslationCache:
    """This process's translation cache, stored under ``<cache>/alfworld_translations``."""
    global _default_translations
    if _default_translations is None:
        _default_translations = TranslationCache(cache_root() / TRANSLATIONS_DIRNAME)
    return _default_translations


def _copying_memo(parse: Callable[..., Any], maxsize: int) -> Callable[..., Any]:
    """``parse`` memoized on its (hashable) arguments; each call gets its own deep copy."""
    cached = lru_cache(maxsize=maxsize)(parse)

    def memo_parse(*args: Any, **kwargs: Any) -> Any:
        return deepcopy(cached(*args, **kwargs))

    return memo_parse


# One memo per parser: the grammar document (per game, large), symbol strings and logic
# queries (shared by all games, small and many).
_PARSE_MEMOS: tuple[tuple[Any, Callable[..., Any]], ...] = (
    (pddl_logic, _copying_memo(pddl_logic._parse_and_convert, maxsize=64)),
    (textgen, _copying_memo(textgen._parse_and_convert, maxsize=16384)),
    (tw_logic, _copying_memo(tw_logic._parse_and_convert, maxsize=16384)),
)


def _copy_context(context: dict[str, Any]) -> dict[str, Any]:
    """``textgen.copy_context`` with the ``variables`` and ``mapping`` dicts copied, not their content."""
    return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}


@contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


@contextmanager
def argv_kept() -> Iterator[None]:
    """Undo Fast Downward's ``sys.argv = ["translate.py", ...]`` hack (every translation runs
    it), so that the caller's command line survives."""
    with _patched(sys, "argv", sys.argv):
        yield


@contextmanager
def engine_speedups(translations: TranslationCache | None = None) -> Iterator[None]:
    """Run the engine with cached translations and parses and light context copies.

    translations: the translation cache to use; default :func:`default_translations`.
    Also restores ``sys.argv``, which every translation overwrites.
    """
    with ExitStack() as stack:
        stack.enter_context(argv_kept())
        stack.enter_context(_patched(fast_downward, "pddl2sas", translations or default_translations()))
        for module, memo_parse in _PARSE_MEMOS:
            stack.enter_context(_patched(module, "_parse_and_convert", memo_parse))
        stack.enter_context(_patched(textgen, "copy_context", _copy_context))
        yield
