"""One module per log format; ``PARSERS`` lists them in the order they are tried.

Order matters where triggers overlap: messages with a fixed wording (Megatron's
iteration line, loss-scale messages, detectron2's error) go before the looser
shapes, and the generic fallback runs only on records no other parser recognised.
Parsers of one-off messages whose triggers are common words (a loop's own skip lines,
the elastic agent's failure table) come late, so that their triggers do not keep the
formats read in bulk (Megatron, mmengine, Hugging Face) from it; the elastic table goes
before the anomaly parser, whose traceback lines it holds. A printed model's lines come
last: their triggers (parentheses, table bars) are in most formats' lines.
"""

from __future__ import annotations

from analyzer.ingest.logformats.anomaly import AnomalyParser
from analyzer.ingest.logformats.base import Fallback, LineParser
from analyzer.ingest.logformats.detectron2 import Detectron2Parser
from analyzer.ingest.logformats.elastic import ElasticParser
from analyzer.ingest.logformats.fairseq import FairseqParser
from analyzer.ingest.logformats.generic import GenericParser
from analyzer.ingest.logformats.hf import HuggingFaceParser
from analyzer.ingest.logformats.keras import KerasParser
from analyzer.ingest.logformats.lightning import LightningParser
from analyzer.ingest.logformats.loop_skips import LoopSkipParser
from analyzer.ingest.logformats.megatron import MegatronParser
from analyzer.ingest.logformats.metric_logger import MetricLoggerParser
from analyzer.ingest.logformats.mixed_precision import MixedPrecisionParser
from analyzer.ingest.logformats.mmengine import MMEngineParser
from analyzer.ingest.logformats.model_print import ModelPrintParser
from analyzer.ingest.logformats.nanogpt import NanoGPTParser
from analyzer.ingest.logformats.progress_meter import ProgressMeterParser
from analyzer.ingest.logformats.stopping import StoppingParser
from analyzer.ingest.logformats.tbx_warnings import TensorboardXParser
from analyzer.ingest.logformats.tensorflow import TensorFlowParser
from analyzer.ingest.logformats.timm import TimmParser
from analyzer.ingest.logformats.yolo import YoloParser

PARSERS: tuple[type[LineParser], ...] = (
    MegatronParser,
    MixedPrecisionParser,
    Detectron2Parser,
    HuggingFaceParser,
    MMEngineParser,
    MetricLoggerParser,
    TimmParser,
    ProgressMeterParser,
    FairseqParser,
    LightningParser,
    KerasParser,
    YoloParser,
    NanoGPTParser,
    TensorFlowParser,
    LoopSkipParser,
    TensorboardXParser,
    StoppingParser,
    ElasticParser,
    AnomalyParser,
    ModelPrintParser,
)
"""Tried in this order on every record holding one of their triggers."""

FALLBACK: type[Fallback] = GenericParser

__all__ = ["FALLBACK", "PARSERS", "LineParser"]
