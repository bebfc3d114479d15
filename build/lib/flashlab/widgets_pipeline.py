"""Deprecated name of :mod:`flashlab.widgets.pipeline` (the explorer) and
:mod:`flashlab.pipeline.settings` (the design point it explores); import from those."""
import warnings

from flashlab.pipeline.settings import *  # noqa: F401,F403
from flashlab.pipeline.settings import __all__ as _settings_all
from flashlab.widgets.pipeline import *  # noqa: F401,F403
from flashlab.widgets.pipeline import __all__ as _widgets_all

__all__ = [*_settings_all, *_widgets_all]

warnings.warn("flashlab.widgets_pipeline is deprecated: import the explorer from "
              "flashlab.widgets.pipeline and PipelineSettings from flashlab.pipeline.settings",
              DeprecationWarning, stacklevel=2)
