"""How ``reveal`` shows a puzzle's worked solution: as its source code, not a repr."""

from __future__ import annotations

import inspect
import textwrap


class Solution:
    """A puzzle's worked solution as its code: shown as its source (highlighted in a
    notebook), called or passed to ``check`` as the function or class itself (``.code``)."""

    def __init__(self, name: str, code):
        self.name = name
        self.code = code

    @property
    def source(self) -> str:
        try:
            return textwrap.dedent(inspect.getsource(self.code))
        except (OSError, TypeError):
            return repr(self.code)

    def __call__(self, *args, **kwargs):
        return self.code(*args, **kwargs)

    def __getattr__(self, attribute):
        if attribute in ("name", "code"):
            raise AttributeError(attribute)
        return getattr(self.code, attribute)

    def __repr__(self) -> str:
        return f"# {self.name}: the worked solution\n{self.source}"

    def _repr_html_(self) -> str | None:
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer
        except ImportError:
            return None
        formatter = HtmlFormatter(noclasses=True, nowrap=False)
        return f"<b>{self.name}</b>" + highlight(self.source, PythonLexer(), formatter)
