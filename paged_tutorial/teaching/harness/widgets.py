"""The one widget the chapters share: a slider over a recorded run that redraws a figure.

Notebooks 06 and 09 record an engine run step by step and let the reader move through it;
``step_slider(steps, draw)`` is that slider: an IntSlider over the steps' engine indices and an
Output that shows ``draw(position)`` (a matplotlib figure) for the chosen step.  ipywidgets and
matplotlib are imported here, when a widget is made.
"""

from __future__ import annotations


def step_slider(steps, draw, css_class: str, min_height: str = "280px"):
    """An IntSlider over ``steps`` (each with an ``.index``: the engine step it records) and an
    Output that redraws ``draw(position in steps)`` whenever the slider moves."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    first = steps[0].index
    slider = widgets.IntSlider(value=first, min=first, max=steps[-1].index, step=1,
                               description="engine step", continuous_update=False,
                               style={"description_width": "initial"},
                               layout=widgets.Layout(width="480px"))
    out = widgets.Output(layout=widgets.Layout(min_height=min_height))

    def show(_change=None):
        fig = draw(slider.value - first)
        with out:
            out.clear_output(wait=True)
            display(fig)
        plt.close(fig)

    slider.observe(show, names="value")
    show()
    box = widgets.VBox([slider, out])
    box.add_class(css_class)
    return box
