"""Great Expectations' Data Docs page views, compiling each Jinja template once per process.

GX builds a new Jinja environment for every Data Docs build, so every build parses and compiles
its page templates again, a large part of the CPU of writing a release's docs
(``benchmarks/gx_docs_bench.py``).  These are GX's own views with one process-wide bytecode cache
in memory: the validation service and a worker compile a template on their first build and load
the compiled code afterwards.  The pages are the same (the cache holds what Jinja compiled from
the same source, keyed by template name and source checksum).

It imports GX at module level, so only :func:`catalog.validation.gx.run_suites_here` imports it,
after loading GX, and GX itself, by the names in the site configuration :func:`site_views` gives.
"""

from __future__ import annotations

from typing import Any

import jinja2
from great_expectations.render.view.view import DefaultJinjaIndexPageView, DefaultJinjaPageView


class CompiledTemplates(jinja2.BytecodeCache):
    """Compiled templates in memory, O(templates) bytes; a dict read or write is atomic, so the
    validation service's threads may share it."""

    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)  # ignored by Jinja if the source checksum changed

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self._code[bucket.key] = bucket.bytecode_to_string()

    def clear(self) -> None:
        self._code.clear()

    def __len__(self) -> int:
        return len(self._code)


COMPILED = CompiledTemplates()


class PageView(DefaultJinjaPageView):
    """GX's page view (suites, validation results) with :data:`COMPILED`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = COMPILED


class IndexPageView(DefaultJinjaIndexPageView):
    """GX's index page view with :data:`COMPILED`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = COMPILED


def site_views() -> dict[str, Any]:
    """The parts of a ``SiteBuilder`` configuration that select these views (GX merges them into
    its defaults; the profiling section, which dprelease never fills, keeps GX's view)."""
    view = {"module_name": __name__, "class_name": PageView.__name__}
    return {
        "site_index_builder": {
            "class_name": "DefaultSiteIndexBuilder",
            "view": {"module_name": __name__, "class_name": IndexPageView.__name__},
        },
        "site_section_builders": {
            "expectations": {"view": view},
            "validations": {"view": view},
        },
    }
