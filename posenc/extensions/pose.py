"""PoSE fine-tuning methods (Zhu et al. 2023, "PoSE: Efficient Context Window Extension of LLMs via Positional
Skip-wise Training", arXiv:2309.10400): a scaling method (PI, YaRN, ...) fine-tuned at the ORIGINAL length with
skip-wise position ids that cover the target length (``posenc.pose_position_ids``), instead of at the target
length.

Each variant writes its base method's config and adds the registry's ``train_positions`` hook; the lab fine-tunes
it at the training length with those positions and reports it as ``scaling: "pose-<base>"``, ``finetuned: true``
(it has no zero-shot row: untrained, it is the base method). ``pose_variant("llama3")`` registers another.
"""

from __future__ import annotations

from posenc.extensions.registry import METHODS, ExtensionSpec, get_method, register_method
from posenc.pose import pose_position_ids

POSE_CHUNKS = 2  # the paper's default number of chunks


def pose_train_positions(batch: int, seq_len: int, spec: ExtensionSpec, generator=None):
    """PoSE position ids [batch, seq_len] covering spec.target (the registry's ``train_positions`` hook)."""
    return pose_position_ids(batch, seq_len, spec.target, chunks=POSE_CHUNKS, generator=generator)


def pose_variant(base: str, *, replace: bool = False) -> str:
    """Register ``pose-<base>``: ``base``'s config, fine-tuned at the original length with PoSE positions."""
    method = get_method(base, "base")
    name = f"pose-{base}"

    def write(spec: ExtensionSpec, **options):
        return METHODS[base].write(spec, **options)

    register_method(name, label=f"{method.label} + PoSE", expects_finetune=True, defaults=method.defaults,
                    keeps_original_length=method.keeps_original_length, lab_factor=method.lab_factor,
                    transformers_form=method.transformers_form, train_positions=pose_train_positions,
                    replace=replace,
                    note=f"{method.label} fine-tuned at the original length with PoSE's skip-wise position ids "
                         "covering the target (Zhu et al. 2023: close to full-length fine-tuning at a fraction of "
                         "the cost); posenc's lab comparison: docs/lab.md.")(write)
    return name


pose_variant("linear")
pose_variant("yarn")
