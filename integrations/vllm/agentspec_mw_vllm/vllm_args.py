"""How vLLM's argument parser reads the server arguments passed through to it.

``agentspec serve`` checks the user's vLLM arguments (after ``--``) for options it must
refuse (``--api-key`` on a server that binds scopes) or leave to the user (the tool-calling
set-up). vLLM's ``FlexibleArgumentParser`` reads more spellings than the canonical one: ``_``
for ``-`` in an option's name, any unambiguous prefix of it, the dotted form it regroups
into a JSON value (``--opt.key v``), and the top-level keys of a ``--config FILE.yaml`` (each
key ``k`` read as ``--k``). This module gives both checks one reading of all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["CONFIG_OPTION", "config_files", "config_options", "option_name", "passed_options"]

CONFIG_OPTION = "--config"
"""vLLM's option naming a YAML file of more options (``FlexibleArgumentParser``)."""


def option_name(arg: str) -> str:
    """The option name vLLM's parser matches ``arg`` by: the part before a ``=`` or
    ``.``, with ``_`` read as ``-`` (``--api_key.x=1`` -> ``--api-key``); an argument that
    is no option (no leading ``--``) comes back as it is."""
    if not arg.startswith("--"):
        return arg
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def config_files(args: Sequence[str]) -> list[str]:
    """The files that ``args`` name with ``--config FILE`` (what vLLM reads) or
    ``--config=FILE``."""
    files = [b for a, b in zip(args, args[1:], strict=False) if a == CONFIG_OPTION]
    return files + [a.split("=", 1)[1] for a in args if a.startswith(f"{CONFIG_OPTION}=")]


def config_options(path: str) -> list[str]:
    """The option names vLLM takes from its ``--config`` YAML file: ``--KEY`` for each
    top-level key (``FlexibleArgumentParser.load_config_file``).

    Raises:
        ValueError: the file cannot be read, is not YAML, or is not a mapping.
    """
    import yaml

    what = f"vLLM's {CONFIG_OPTION} file {path!r}"
    try:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {what} (to check it for --api-key): {exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} is not YAML: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{what} must be a YAML mapping of options (option: value)")
    return [f"--{key}" for key in config]


def passed_options(args: Sequence[str], *, strict: bool) -> list[tuple[str, str]]:
    """Every option ``args`` pass, as ``(argument as written, where)``: the arguments
    themselves (``where`` empty), then the keys of each ``--config`` file they name
    (``where``: ``" in --config FILE"``).

    Raises:
        ValueError: ``strict`` and a ``--config`` file cannot be read as a YAML mapping
            (with ``strict=False`` such a file is skipped: vLLM refuses it when it starts).
    """
    found = [(a, "") for a in args]
    for path in config_files(args):
        try:
            found += [(o, f" in {CONFIG_OPTION} {path}") for o in config_options(path)]
        except ValueError:
            if strict:
                raise
    return found
