"""Puts this package's conf/ on Hydra's search path: `method=barlow`, `plugin=[uniformity]`, `data=blobs`,
`+suite=spread` and the spread job's own config find their files (Hydra finds this plug-in in the hydra_plugins
namespace package; no __init__.py in hydra_plugins/)."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class AugsslBarlowSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="augssl-barlow", path="pkg://augssl_barlow.conf")
