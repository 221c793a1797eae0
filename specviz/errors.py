"""User-facing errors: each carries a one-line message that the CLI and the app show as is."""


class SpecvizError(Exception):
    """Base class for errors caused by user input (bad prompt, settings, files, models)."""


class SettingsError(SpecvizError, ValueError):
    """Out-of-range decoding or method settings."""


class PromptError(SpecvizError, ValueError):
    """Empty prompt or prompt longer than the model's context."""


class TraceError(SpecvizError, ValueError):
    """A trace file that cannot be read (not JSON, wrong schema, inconsistent)."""
