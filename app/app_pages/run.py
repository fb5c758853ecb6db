"""Run: the training as one run: its framework layout, segments and files by role, the
training settings its metadata gives (each with the file it came from), and the metadata
files read with their status."""

from __future__ import annotations

import streamlit as st

from app import runinfo, tables, ui

sel, result = ui.run_page("Run")
run = result.run

st.header("Folders and files")
layout = run.layout
if layout is None:
    st.caption(f"{tables.plural(len(run.files), 'file')}; discovery recorded no layout for "
               "this run.")
else:
    kinds = ", ".join(f"**{k}**" for k in layout.layouts) or "no framework's"
    st.markdown(f"Layout recognised: {kinds}; {tables.plural(len(layout.files), 'file')} below the "
                f"training's folder `{layout.root}`.")
    segments = runinfo.segment_rows(run)
    if segments:
        st.subheader("Segments")
        st.caption("The folders the framework made for parts of this training (one per "
                   "restart, or written side by side), in the order they were written.")
        tables.show(tables.frame(segments), key="run_segments")
st.subheader("Files by role")
tables.show(tables.frame(runinfo.file_rows(run)), key="run_files")

st.header("Training settings")
settings = runinfo.setting_rows(run)
if not settings:
    st.info("No training setting could be read for this run: it has no framework metadata "
            "(hparams.yaml, training_args.bin, trainer_state.json, config.json, a checkpoint's "
            "hyperparameters) that gives one" + (", see the files below." if run.metadata
                                                  and run.metadata.files else "."))
else:
    tables.show(tables.frame(settings), key="run_settings")
    missing = runinfo.missing_settings(run)
    if missing:
        st.caption(f"Not given by any metadata file: {', '.join(missing)}.")
files = runinfo.metadata_rows(run)
if files:
    st.subheader("Metadata files read")
    st.caption("read: every field looked for was taken; partial: damaged, what came before "
               "is kept; listed: not opened on purpose; failed: nothing could be read.")
    tables.show(tables.frame(files), key="run_metadata_files")
