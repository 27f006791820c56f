"""Field layer: the registry of trajectory fields, model shapes, the R3 codec and SGLang's wire format."""

from dressage.fields.models import MODEL_PRESETS, ModelSpec, get_model
from dressage.fields.r3 import (
    DEFAULT_R3_DTYPE,
    R3_DTYPES,
    check_dtype_holds_experts,
    decode_routed_experts,
    encode_routed_experts,
    max_expert_id,
    r3_dtype,
    r3_itemsize,
)
from dressage.fields.r3_stream import RoutedExpertsSpec
from dressage.fields.registry import FIELDS, TRANSFERABLE_FIELDS, FieldSpec, check_field_names, get_field
from dressage.fields.sglang import (
    GenerateOutput,
    decode_generate_response,
    decode_output_token_logprobs,
    decode_routed_experts_b64,
    encode_routed_experts_b64,
    finish_type,
    is_queued_abort,
    weight_version_of,
)
from dressage.fields.versions import NAMED_BASE, VersionTable

__all__ = [
    "FIELDS", "TRANSFERABLE_FIELDS", "FieldSpec", "get_field", "check_field_names",
    "ModelSpec", "MODEL_PRESETS", "get_model",
    "R3_DTYPES", "DEFAULT_R3_DTYPE", "r3_dtype", "r3_itemsize", "max_expert_id",
    "check_dtype_holds_experts", "encode_routed_experts", "decode_routed_experts", "RoutedExpertsSpec",
    "GenerateOutput", "decode_generate_response", "decode_output_token_logprobs",
    "decode_routed_experts_b64", "encode_routed_experts_b64",
    "finish_type", "is_queued_abort", "weight_version_of", "VersionTable", "NAMED_BASE",
]
