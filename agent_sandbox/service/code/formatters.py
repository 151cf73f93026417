"""What a Python (ipykernel) kernel is started with besides its template's command: a
display formatter giving a pandas DataFrame's columns as ``e2b/data`` (E2B's code
interpreter's ``result.data``: each column a list, times as ISO strings, NaN as null), and
Pillow images displayed when shown or saved (as E2B's template does). Registered by
type name, so pandas is imported only by a cell that uses it; run by ``exec_lines``, so it
binds no name in the user's namespace and counts no execution."""

from __future__ import annotations

DATA_MIME = "e2b/data"

_SETUP = """
def _abx_setup():
    import os

    import IPython
    import IPython.display
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class DataFormatter(BaseFormatter):
        format_type = Unicode("MIME")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

    def cell(v):  # times as ISO strings, NaN as null (JSON has no NaN)
        if hasattr(v, "isoformat"):
            return v.isoformat()
        return None if isinstance(v, float) and v != v else v

    def columns(df):
        return {str(name): [cell(v) for v in col]
                for name, col in df.to_dict(orient="list").items()}

    shell = IPython.get_ipython()
    if shell is not None and "MIME" not in shell.display_formatter.formatters:
        found = DataFormatter(parent=shell.display_formatter)
        for module in ("pandas", "pandas.core.frame"):  # DataFrame.__module__, old and new
            found.for_type_by_name(module, "DataFrame", columns)
        shell.display_formatter.formatters["MIME"] = found
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
""".replace("MIME", DATA_MIME)


def kernel_argv(argv: list[str]) -> list[str]:
    """``argv`` with the formatters' setup when it starts an ipykernel."""
    if not any("ipykernel" in a for a in argv):
        return argv
    # No SQLite history: cells are not kept in a file of the sandbox's home, and a hidden
    # cell taken off the count (surfaces/e2b/cells.py) cannot clash with the next one's.
    return [*argv, "--HistoryManager.enabled=False", f"--IPKernelApp.exec_lines={_SETUP}"]
