"""Names vulture reports as unused that a framework uses, though no Python code here does.

vulture is in the dev extra; ``make deadcode`` runs

    vulture parityserve benchmarks tests scripts/vulture_whitelist.py --min-confidence 60

vulture matches by name, so each name below marks every definition of that name as used:
keep the list short and the reason next to each. This file is read by vulture, never run.
"""
# ruff: noqa
# mypy: ignore-errors

# PEP 562 module hooks: Python calls them for ``parityserve.X`` and ``models.zoo.X``.
__getattr__
__dir__

# pydantic runs validators by their decorators (config.py, runtime/frontend/schema.py).
_._parity_implies_parm
_._check_fault_keys
_._check_redundancy
_._check_name
_._check_safe
_._check_references
_._one_of
# Fields of the OpenAPI documentation models (runtime/frontend/schema.py): they are the JSON's keys.
_.input_batch
_.binary_data
_.binary_data_size
_.extensions
# A StoreStatistics field (runtime/serving/state_store.py), filled from the counters by keyword.
_.conflicts

# torch calls ``forward`` from ``Module.__call__``.
_.forward
# onnxruntime reads these SessionOptions (models/_onnx.py); tests set ModelProto.ir_version.
_.intra_op_num_threads
_.inter_op_num_threads
_.ir_version
# pyzmq socket options are set as attributes and read by libzmq.
_.curve_server
_.curve_publickey
_.curve_secretkey
_.curve_serverkey
# uvicorn calls these protocol methods and reads these attributes (runtime/frontend/connection.py,
# runtime/server.py, tests/integration/test_connection_limits.py).
_.data_received
_.send_400_response
_.disconnected
_.capture_signals
_.should_exit

# pytest reads module-level ``pytestmark`` and runs the autouse fixture in tests/conftest.py.
pytestmark
parityserve_home
# Loaded by "module:Class" source strings in tests/unit/models/test_models_loader.py,
# tests/unit/models/test_models_stateful.py and tests/unit/core/test_selection.py.
Doubler
ShortChanged
BrokenSetup
NoUpdate
DuckPolicy
NotAPolicy

# grpc calls the V2 service's methods by name (runtime/frontend/grpc_v2.py, GRPCInferenceService).
_.ServerLive
_.ServerReady
_.ModelReady
_.ServerMetadata
# protobuf map entries are written by attribute (InferParameter.string_param).
_.string_param

# LitServe calls its API's hooks by name (benchmarks/frontend_apps.py).
_.decode_request
_.encode_response

# An autouse pytest fixture: pytest runs it for every test in its module.
_keep_sigterm

# pydantic runs model validators by decoration (config.py).
_._check_policy
_._check_shape
_._check_address
# Records read as a whole (asdict / JSON): the profile document's elapsed time, and the
# HAMS primary shipper's statistics (core/hams/shipping.py), kept for the state-manager runtime.
_.elapsed_s
_.last_executed
_.unshipped

# Test operators loaded by a "python:module:Class" source string, not by name.
Unseeded
RunOnly

# httptools calls its parser's callbacks by name (the measuring-stick protocol of
# benchmarks/diagnostics/asgi_layer.py).
_.on_header
_.on_body

# uvicorn's protocol starts a request cycle by calling its run_asgi (runtime/frontend/hot_cycle.py's
# HotCycle stands in for uvicorn's RequestResponseCycle).
_.run_asgi

# uvicorn asks its transport for these; the hot-cycle tests' recording transport answers them.
_.get_extra_info
_.get_write_buffer_size

# pydantic field validators (config.py): run by decoration.
_._check_datatype
_._check_input_shape
# A TallyStatistics record (core/edge_guards.py) read as a whole by the admin state.
_.addresses
_.busiest
# A pytest fixture requested by parameter name (tests/e2e/test_plain_install.py).
without_torch
# hypothesis's RuleBasedStateMachine runs its @rule/@invariant methods and teardown by
# decoration, and unittest collects the TestCase it makes (core/hams recovery plan test).
_.lose_while_taking_over
_.fails_only_with_no_holder
_.teardown
TestRecoveryPlan
# Counters of the HAMS chaos checker (benchmarks/hams_chaos.py), written to its JSON as a whole.
_.unchecked
_.errors_after_applied
_.diverged_streams
# A field of a model the config-docs test defines, read only by the docs generator.
spill_ms
