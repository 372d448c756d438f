"""Expected failures, each with the exit code ``python -m pipeline`` ends with.

Anything raised as a ``PipelineError`` is printed as one readable line, without a traceback.
Anything else is a bug and keeps its traceback.
"""


class PipelineError(Exception):
    exit_code = 3


class ConfigError(PipelineError):
    """A bad config value or override: nothing has run yet."""
    exit_code = 2


class StageError(PipelineError):
    """A stage failed (bad input, runtime crash, parity mismatch); nothing half-written is kept."""
    exit_code = 3


class GateFailed(PipelineError):
    """The candidate was built and measured but does not pass; it and its report are kept."""
    exit_code = 1


class RegistryError(PipelineError):
    """A registry failed or refused an operation (unreachable, missing version, bad reply)."""
    exit_code = 3


class CorruptBlob(RegistryError):
    """Bytes read from a registry do not match their digest; nothing was handed out."""
    exit_code = 3


class PromotionRefused(RegistryError):
    """An alias was asked to point at a version whose gate failed, without ``--force``."""
    exit_code = 1


def cli(run, argv: list[str], doc: str) -> int:
    """A command line's shell: ``-h`` prints ``doc``; a ``PipelineError`` becomes one line on
    stderr and its exit code; ``run(argv)`` gives the exit code otherwise."""
    import sys

    if argv and argv[0] in ("-h", "--help"):
        print(doc)
        return 0
    try:
        return run(argv)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
