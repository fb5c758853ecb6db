"""Findings: the ranked root causes, each with its evidence, its fix and its rule's docs."""

from __future__ import annotations

import os

import streamlit as st

from analyzer.model import Evidence, Finding
from app import data, health, tables, ui, views

sel, result = ui.run_page("Findings")

run = result.run
logs = {log.path for log in run.logs}
roles = data.tag_roles(sel.ref.path, sel.ref.digest, tuple(run.tags()))
layers = set(roles.layers.values())
tags = set(run.tags())
if result.replay is not None and result.replay.layer:
    layers.add(str(result.replay.layer))


def evidence(e: Evidence, n: int) -> None:
    st.markdown(f"{n}. {e.text}")
    where = e.location
    links = st.columns(3)
    if e.step is not None:
        with links[0]:
            ui.link("timeline", f"step {e.step} on the timeline", sel.ref.name, step=e.step)
    if where is not None and where.line is not None and where.file in logs:
        with links[1]:
            ui.link("logs", f"{os.path.basename(where.file)}:{where.line} in context",
                    sel.ref.name, file=where.file, line=where.line)
    elif where is not None:
        links[1].caption(f"at `{views.where(where, run.path)}`")
    owner = e.subject.rpartition(".")[0] if e.subject else ""
    if e.subject and e.subject in layers:
        with links[2]:
            ui.link("layers", f"layer {e.subject}", sel.ref.name, layer=e.subject)
    elif e.subject and owner in layers:
        with links[2]:
            ui.link("layers", f"tensor {e.subject} in layer {owner}", sel.ref.name,
                    layer=owner)
    elif e.subject and e.subject in tags:
        links[2].caption(f"tag `{e.subject}`")
    elif e.subject:
        links[2].caption(f"about `{e.subject}`")


def card(f: Finding, rank: int) -> None:
    with st.container(border=True):
        st.subheader(f"{rank}. {f.title}")
        st.markdown(f"`{f.code}` **{f.name}** · {f.role} · **{f.confidence}** confidence · "
                    f"score {f.score:.2f}")
        if f.rank_note:
            st.caption(f.rank_note)
        st.markdown("**Evidence**")
        for n, e in enumerate(f.evidence, start=1):
            evidence(e, n)
        st.markdown("**Fix**")
        st.markdown(f.fix or "The rule gives no fix.")
        docs = data.rule_docs(f.code)
        with st.expander(f"Rule docs: {f.code} {f.name}"):
            if docs:
                st.markdown(docs.replace("\n## ", "\n##### "))
            else:
                st.caption("The analyzer has no documentation for this rule.")


if not result.findings:
    if result.failed:
        st.info("No findings are available for this run: the analysis ranked no root cause "
                "for its failure. The timeline, layers, replay and logs pages show the "
                "evidence there is.")
    else:
        well = health.health(result).status
        said = {"unreadable": "nothing of it could be read (see its read issues above)",
                "damaged": "the values read are finite, but its record is damaged (see its "
                           "read issues above), and no rule raised a warning on what was read"}
        st.info("No findings are available for this run: "
                + said.get(well, "every logged value is finite and no rule raised a warning")
                + ".")
else:
    for rank, finding in enumerate(result.findings, start=1):
        card(finding, rank)

if result.skipped_rules:
    n = len(result.skipped_rules)
    with st.expander(f"{tables.plural(n, 'rule')} could not run on this run"):
        tables.show(tables.frame([{"rule": s.code, "name": s.name, "why": s.reason}
                                  for s in result.skipped_rules]), key="skipped_rules")
