# Airlock's code interpreter: IPython startup (written into the kernels' IPYTHONDIR).
# Output as E2B's template gives it: tracebacks without colours, no truncated reprs,
# DataFrames also as `e2b/data`, matplotlib figures also as `e2b/chart`, JSON-able dicts and
# lists also as `application/json`. Nothing heavy is imported here: formatters are registered
# by type name and run only when such an object is displayed.


def _airlock_startup():
    import json
    import os
    import site
    import sys

    from IPython.core.formatters import BaseFormatter

    ip = get_ipython()  # noqa: F821 - IPython's builtin
    try:
        ip.run_line_magic("colors", "nocolor")
    except Exception:
        pass
    ip.display_formatter.formatters["text/plain"].max_seq_length = 0

    # `pip install` lands in the user site when the system one is read-only; make sure the
    # running kernel imports from there without a restart.
    try:
        if site.ENABLE_USER_SITE:
            user_site = site.getusersitepackages()
            os.makedirs(user_site, exist_ok=True)
            if user_site not in sys.path:
                site.addsitedir(user_site)
    except OSError:
        pass

    class DataFormatter(BaseFormatter):
        format_type = "e2b/data"
        print_method = "_repr_e2b_data_"
        _return_type = (dict,)

    class ChartFormatter(BaseFormatter):
        # Not a type registry: matplotlib_inline removes Figure from every formatter's
        # registry when it activates, so the type is checked here instead.
        format_type = "e2b/chart"
        print_method = "_repr_e2b_chart_"
        _return_type = (dict,)

        def __call__(self, obj):
            kind = type(obj)
            if not self.enabled or (kind.__module__, kind.__name__) != ("matplotlib.figure", "Figure"):
                return None
            try:
                return _airlock_chart(obj)
            except Exception:
                return None

    formatters = ip.display_formatter.formatters
    data = formatters["e2b/data"] = DataFormatter(parent=ip.display_formatter)
    formatters["e2b/chart"] = ChartFormatter(parent=ip.display_formatter)

    def dataframe(frame):
        return {
            str(column): json.loads(frame[column].to_json(orient="values", date_format="iso"))
            for column in frame.columns
        }

    data.for_type_by_name("pandas.core.frame", "DataFrame", dataframe)

    def json_able(value):
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            return None
        return value

    formatters["application/json"].for_type(dict, json_able)
    formatters["application/json"].for_type(list, json_able)


def _airlock_unit(label):
    import re

    match = re.search(r"[\(\[]([^\)\]]+)[\)\]]\s*$", label or "")
    return match.group(1) if match else None


def _airlock_axes_chart(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle, Wedge

    def number(value):
        try:
            return float(value)
        except (TypeError, ValueError):
            return str(value)

    x_label, y_label = ax.get_xlabel() or None, ax.get_ylabel() or None
    base = {
        "title": ax.get_title() or None,
        "x_label": x_label,
        "y_label": y_label,
        "x_unit": _airlock_unit(x_label),
        "y_unit": _airlock_unit(y_label),
    }
    artists = [
        a
        for a in ax.get_children()
        if isinstance(a, (Line2D, PathCollection, Rectangle, Wedge))
        and a is not ax.patch
        and not (isinstance(a, Line2D) and a in ax.get_xgridlines() + ax.get_ygridlines())
    ]
    if not artists:
        return None
    kinds = {type(a) for a in artists}

    def ticks(axis):
        return (
            [number(t) for t in axis.get_ticklocs()],
            [t.get_text() for t in axis.get_ticklabels()],
        )

    if kinds == {Line2D} or kinds == {PathCollection}:
        elements = []
        for artist in artists:
            if isinstance(artist, Line2D):
                points = list(zip(artist.get_xdata(), artist.get_ydata()))
            else:
                points = [tuple(p) for p in artist.get_offsets()]
            label = artist.get_label()
            elements.append(
                {
                    "label": "" if label.startswith("_") else label,
                    "points": [[number(x), number(y)] for x, y in points],
                }
            )
        x_ticks, x_tick_labels = ticks(ax.xaxis)
        y_ticks, y_tick_labels = ticks(ax.yaxis)
        return {
            **base,
            "type": "line" if kinds == {Line2D} else "scatter",
            "x_scale": ax.get_xscale(),
            "y_scale": ax.get_yscale(),
            "x_ticks": x_ticks,
            "x_tick_labels": x_tick_labels,
            "y_ticks": y_ticks,
            "y_tick_labels": y_tick_labels,
            "elements": elements,
        }
    if kinds == {Rectangle}:
        labels = [t.get_text() for t in ax.get_xticklabels()]
        elements = []
        for index, bar in enumerate(artists):
            label = labels[index] if index < len(labels) else str(index)
            group = bar.get_label()
            elements.append(
                {
                    "label": label,
                    "value": number(bar.get_height()),
                    "group": "" if group.startswith("_") else group,
                }
            )
        return {**base, "type": "bar", "elements": elements}
    if kinds == {Wedge}:
        texts = [t.get_text() for t in ax.texts]
        elements = [
            {
                "label": texts[i] if i < len(texts) else "",
                "angle": number(w.theta2 - w.theta1),
                "radius": number(w.r),
            }
            for i, w in enumerate(artists)
        ]
        return {"type": "pie", "title": base["title"], "elements": elements}
    return None


def _airlock_chart(figure):
    try:
        charts = [c for c in (_airlock_axes_chart(ax) for ax in figure.get_axes()) if c]
    except Exception:
        return None
    if not charts:
        return None
    if len(charts) == 1:
        return charts[0]
    title = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) else None
    return {"type": "superchart", "title": title, "elements": charts}


_airlock_startup()
del _airlock_startup
