"""Everything that was run, as tables, a room a step:

runs     the runs under the given paths (`tuner run` folders, the trials of `tuner sweep` and `tuner
         reproduce`), each summarized by the selection rule (tuner/selection.py)
tables   the papers' tables rebuilt beside the published numbers, and how well they agree
best     each sweep's best configuration
plots    accuracy curves and searched values against accuracy
write    the whole report: Parquet, Markdown and LaTeX files and figures in one folder
"""
