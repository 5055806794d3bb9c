"""The HTML report: plotly figures drawn from analyzer output, one self-contained file."""

from fsage.reports import sections as _sections  # noqa: F401  (registers the standard sections)
from fsage.reports import sections_bench as _sections_bench  # noqa: F401
from fsage.reports import sections_compare as _sections_compare  # noqa: F401
from fsage.reports import sections_disk as _sections_disk  # noqa: F401
from fsage.reports import sections_lfs as _sections_lfs  # noqa: F401
from fsage.reports.build import register_extra, report_data_from_store
from fsage.reports.html import (
    ReportData,
    Section,
    Table,
    build_sections,
    register_section,
    render,
    section_names,
    write_report,
)

__all__ = [
    "ReportData",
    "Section",
    "Table",
    "build_sections",
    "register_extra",
    "register_section",
    "render",
    "report_data_from_store",
    "section_names",
    "write_report",
]
