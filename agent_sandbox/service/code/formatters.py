"""What a Python (ipykernel) kernel is started with besides its template's command: the
display formatters of E2B's code interpreter, and Pillow images displayed when shown or
saved (as E2B's template does; matplotlib saves PNGs through Pillow, so
``plt.savefig("x.png")`` displays the picture it saved, and ``plt.show()`` the figure).

- ``e2b/data`` (``result.data``): a pandas DataFrame's columns, each a list, times as ISO
  strings, NaN as null.
- ``e2b/chart`` (``result.chart``): a matplotlib figure's chart, extracted by E2B's own
  ``e2b_charts`` package (in the template, as in E2B's): its type (line, scatter, bar, pie,
  box and whisker, a figure of several as a superchart), title, labels, units, scales,
  ticks and elements. A blank figure, or one the extraction fails on, has none, as in E2B.
- ``application/json`` (``result.json``): a dict or a list is also its own JSON (numpy's
  values as lists and numbers, times as ISO strings), as E2B's formatter gives it; one
  holding other objects has none.

NaN and the infinities are null in all three (JSON has none).

Neither imports pandas or matplotlib: only a cell that uses them does. Run by
``exec_lines``, so the setup binds no name in the user's namespace and counts no
execution.

Bounded in the kernel, so that a big one is left out rather than costing its whole
result: the host drops a bundle past ``MAX_EVENT`` bytes or ``MAX_CONTAINERS`` JSON arrays
and objects (``guestlink/kernel_channel.py``), the figure's image and the frame's text
with it. A frame of more than ``MAX_FRAME_CELLS`` values, a figure of more than
``MAX_CHART_POINTS`` plotted points, and any of the three whose JSON comes to more than
``MAX_FORMAT_BYTES`` bytes or ``MAX_FORMAT_CONTAINERS`` arrays and objects, gets no
``data``, ``chart`` or ``json``; its other formats come as usual. These bounds only spare an honest
kernel's result: the host trusts none of it (``guestlink/kernel_cell.py`` checks and
bounds whatever arrives).
"""

from __future__ import annotations

from agent_sandbox.core.models import CHART_MIME, DATA_MIME
from agent_sandbox.guestlink.kernel_channel import MAX_CONTAINERS, MAX_EVENT

MAX_FORMAT_BYTES = MAX_EVENT // 4
MAX_FORMAT_CONTAINERS = MAX_CONTAINERS // 4
MAX_FRAME_CELLS = MAX_FORMAT_BYTES // 8
MAX_CHART_POINTS = MAX_FORMAT_CONTAINERS

_SETUP = """
def _abx_setup():
    import json
    import os
    import sys

    import IPython
    import IPython.display
    from IPython.core.formatters import BaseFormatter, JSONFormatter
    from traitlets import ObjectName, Unicode

    class DataFormatter(BaseFormatter):
        format_type = Unicode("DATA_MIME")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("CHART_MIME")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj):  # not by type: the inline backend pops every Figure's
            figure = sys.modules.get("matplotlib.figure")  # printer when it starts
            if figure is not None and isinstance(obj, figure.Figure):
                return chart(obj)
            return super().__call__(obj)

    class JsonFormatter(JSONFormatter):
        def __call__(self, obj):  # a dict or a list is its own JSON, as in E2B
            if isinstance(obj, (dict, list)):
                try:
                    value = bounded(json.loads(json.dumps(obj, default=plain)))
                except (TypeError, ValueError, RecursionError):
                    value = None
                if value is not None:
                    return value, {"expanded": True}
            return super().__call__(obj)

    def plain(v):  # numpy's arrays and numbers, times: as E2B's orjson gives them
        if hasattr(v, "tolist"):
            return v.tolist()
        if hasattr(v, "isoformat"):
            return v.isoformat()
        raise TypeError(type(v).__name__)

    def finite(v):  # NaN and the infinities as null: JSON has none
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [finite(x) for x in v]
        return v

    def bounded(value):  # JSON, NaN as null; None past what the host takes in one result
        try:
            text = json.dumps(value, default=str, allow_nan=False)
        except ValueError:
            value = finite(value)
            text = json.dumps(value, default=str)
        if (len(text) > MAX_FORMAT_BYTES
                or text.count("[") + text.count("{") > MAX_FORMAT_CONTAINERS):
            return None
        return value

    def cell(v):  # times as ISO strings, NaN as null (JSON has no NaN)
        if hasattr(v, "isoformat"):
            return v.isoformat()
        return None if isinstance(v, float) and v != v else v

    def columns(df):
        if df.size > MAX_FRAME_CELLS:
            return None
        return bounded({str(name): [cell(v) for v in col]
                        for name, col in df.to_dict(orient="list").items()})

    def points(figure):
        total = 0
        for ax in figure.get_axes():
            total += sum(len(line.get_xdata()) for line in ax.get_lines())
            total += sum(len(c.get_offsets()) for c in ax.collections)
            total += len(ax.patches)
        return total

    def chart(figure):
        try:  # as E2B's formatter: no chart when the extraction cannot make one
            from e2b_charts import chart_figure_to_dict

            if points(figure) > MAX_CHART_POINTS:
                return None
            return bounded(chart_figure_to_dict(figure)) or None
        except Exception:
            return None

    shell = IPython.get_ipython()
    if shell is not None and "DATA_MIME" not in shell.display_formatter.formatters:
        found = DataFormatter(parent=shell.display_formatter)
        for module in ("pandas", "pandas.core.frame"):  # DataFrame.__module__, old and new
            found.for_type_by_name(module, "DataFrame", columns)
        shell.display_formatter.formatters["DATA_MIME"] = found
        shell.display_formatter.formatters["CHART_MIME"] = ChartFormatter(
            parent=shell.display_formatter)
        shell.display_formatter.formatters["application/json"] = JsonFormatter(
            parent=shell.display_formatter)
    try:  # Pillow comes with matplotlib: an image shown or saved is displayed, as in E2B
        from PIL import Image
    except ImportError:
        return
    save = Image.Image.save

    def saved(self, fp, *args, **kwargs):
        save(self, fp, *args, **kwargs)
        if isinstance(fp, (str, os.PathLike)):  # to a file: not _repr_png_'s own buffer
            IPython.display.display(self)

    Image.Image.show = lambda self, *args, **kwargs: IPython.display.display(self)
    Image.Image.save = saved
_abx_setup()
del _abx_setup
"""
for _name, _value in (("DATA_MIME", DATA_MIME), ("CHART_MIME", CHART_MIME),
                      ("MAX_FORMAT_BYTES", MAX_FORMAT_BYTES),
                      ("MAX_FORMAT_CONTAINERS", MAX_FORMAT_CONTAINERS),
                      ("MAX_FRAME_CELLS", MAX_FRAME_CELLS),
                      ("MAX_CHART_POINTS", MAX_CHART_POINTS)):
    _SETUP = _SETUP.replace(_name, str(_value))


def kernel_argv(argv: list[str]) -> list[str]:
    """``argv`` with the formatters' setup when it starts an ipykernel."""
    if not any("ipykernel" in a for a in argv):
        return argv
    # No SQLite history: cells are not kept in a file of the sandbox's home, and a hidden
    # cell taken off the count (surfaces/e2b/cells.py) cannot clash with the next one's.
    return [*argv, "--HistoryManager.enabled=False", f"--IPKernelApp.exec_lines={_SETUP}"]
