"""Renderers: rich tables, JSON, plotly figures, the HTML report. They never compute."""
