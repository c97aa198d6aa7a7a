"""The dashboard's pages: title, file and icon, in navigation order (the first is the home page)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PageInfo:
    title: str
    path: str  # relative to dashboard/app.py
    icon: str

    @property
    def url_path(self) -> str:
        """The page's path in the URL, as Streamlit derives it from the file name."""
        return self.path.rsplit("/", 1)[-1].removesuffix(".py")


PAGES = (
    PageInfo("Overview", "app_pages/overview.py", ":material/grid_view:"),
    PageInfo("Compare", "app_pages/compare.py", ":material/compare_arrows:"),
    PageInfo("Trends", "app_pages/trends.py", ":material/show_chart:"),
    PageInfo("Serving", "app_pages/serving.py", ":material/speed:"),
    PageInfo("Scaling", "app_pages/scaling.py", ":material/stacked_line_chart:"),
    PageInfo("Precision & context", "app_pages/precision.py", ":material/tune:"),
    PageInfo("Ops", "app_pages/ops.py", ":material/bar_chart:"),
    PageInfo("Compilation", "app_pages/compilation.py", ":material/build:"),
    PageInfo("Ceilings", "app_pages/ceilings.py", ":material/vertical_align_top:"),
    PageInfo("Run details", "app_pages/run_details.py", ":material/description:"),
)
BY_TITLE = {page.title: page for page in PAGES}
