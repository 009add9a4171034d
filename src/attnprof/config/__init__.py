"""The run configuration: pydantic models and `load_config`. YAML and validation only; no torch.

- `fields`: the field types and one value's checks (device, masks and score mods as text, kv_cache);
- `shapes`: `Shape` (an attention shape and the spec it gives) and `Sweep` (the sweep's axes);
- `models`: `Config`, `Schedule`, `Exclusion` and `MeasureOptions`;
- `messages`: validation errors as one line per problem, `validate_mapping`;
- `loading`: YAML in, a `Config` out (`load_config`, `parse_config`, `apply_overrides`).

Every name is importable from `attnprof.config` itself.
"""

from attnprof.config.fields import (
    DEVICE_PATTERN,
    KvCache,
    MaskText,
    Mode,
    Positive,
    ScoreModText,
    device_name,
    mask_text,
    nonempty,
    score_mod_text,
)
from attnprof.config.loading import (
    apply_overrides,
    load_config,
    parse_config,
    read_yaml,
    yaml_problem,
)
from attnprof.config.messages import (
    FieldNames,
    SchemaT,
    close_matches,
    did_you_mean,
    format_validation_error,
    validate_mapping,
    validation_error,
)
from attnprof.config.models import (
    MODEL_NCU_LAUNCHES,
    NCU_LAUNCHES,
    ColdL2,
    Config,
    CudaGraph,
    Exclusion,
    MeasureOptions,
    Schedule,
    cuda_graph_choice,
)
from attnprof.config.shapes import REQUIRED_SHAPE_FIELDS, Shape, Sweep

__all__ = [
    "DEVICE_PATTERN",
    "MODEL_NCU_LAUNCHES",
    "NCU_LAUNCHES",
    "REQUIRED_SHAPE_FIELDS",
    "ColdL2",
    "Config",
    "CudaGraph",
    "Exclusion",
    "FieldNames",
    "KvCache",
    "MaskText",
    "MeasureOptions",
    "Mode",
    "Positive",
    "Schedule",
    "SchemaT",
    "ScoreModText",
    "Shape",
    "Sweep",
    "apply_overrides",
    "close_matches",
    "cuda_graph_choice",
    "device_name",
    "did_you_mean",
    "format_validation_error",
    "load_config",
    "mask_text",
    "nonempty",
    "parse_config",
    "read_yaml",
    "score_mod_text",
    "validate_mapping",
    "validation_error",
    "yaml_problem",
]
