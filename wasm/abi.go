package wasm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// ABIVersion is the newest module ABI this host implements; see docs/ABI.md.
// Every version from MinABIVersion up is still served: a module built for ABI
// v1 imports fleetlearn_v1 and runs unchanged.
const ABIVersion = 4

// MinABIVersion is the oldest module ABI this host still serves.
const MinABIVersion = 1

// HostModule is the import module name of ABIVersion's host functions.
const HostModule = "fleetlearn_v4"

// HostModuleOf is the import module name of ABI version v's host functions.
// Each version has its own namespace, and a module imports only from the one
// of the version it declares.
func HostModuleOf(v int) string { return "fleetlearn_v" + strconv.Itoa(v) }

// ABIRange says which module ABIs this build serves, for version lines:
// "module ABI 1-4".
func ABIRange() string {
	return fmt.Sprintf("module ABI %d-%d", MinABIVersion, ABIVersion)
}

// SupportedABIVersions lists the module ABI versions this host serves, oldest
// first, as an agent advertises them to the server.
func SupportedABIVersions() []uint32 {
	out := make([]uint32, 0, ABIVersion-MinABIVersion+1)
	for v := MinABIVersion; v <= ABIVersion; v++ {
		out = append(out, uint32(v))
	}
	return out
}

// namespaceVersion is the ABI version whose host module is named mod, or 0
// when mod names none this host serves.
func namespaceVersion(mod string) int {
	for v := MinABIVersion; v <= ABIVersion; v++ {
		if mod == HostModuleOf(v) {
			return v
		}
	}
	return 0
}

// Export names a module must provide.
const (
	exportVersion  = "fleetlearn_abi_version"
	exportTrain    = "train"
	exportEvaluate = "evaluate"
	exportInit     = "_initialize"
)

// wasiAllowed are the WASI preview-1 functions a module may import: exactly what the
// Go wasip1 runtime and package os link. Each is served with no preopened directories, an empty stdin, no
// arguments, no environment, a fake clock, an injected random source, and stdout
// and stderr captured into bounded buffers, so none of them reaches the device.
var wasiAllowed = map[string]bool{
	"args_get": true, "args_sizes_get": true, "environ_get": true, "environ_sizes_get": true,
	"clock_time_get": true, "clock_res_get": true, "fd_read": true, "fd_write": true, "fd_close": true,
	"fd_fdstat_get": true, "fd_fdstat_set_flags": true, "fd_prestat_get": true,
	"fd_prestat_dir_name": true, "random_get": true, "poll_oneoff": true,
	"proc_exit": true, "sched_yield": true,
}

const wasiModule = "wasi_snapshot_preview1"

// request is what the host hands a module through input_read, as JSON.
type request struct {
	ABI    int             `json:"abi"`
	Kind   string          `json:"kind"`
	Hyper  json.RawMessage `json:"hyper"`
	Seed   uint64          `json:"seed"`
	Params []paramInfo     `json:"params"`
	Data   dataInfo        `json:"data"`
	// Trainable is ABI 2's (and every later version's): the parameter
	// indices a train call may change.
	Trainable []int `json:"trainable,omitempty"`
	// Arch is ABI 4's (and every later version's): the model's
	// architecture (model.Model.Arch) when it has one.
	Arch string `json:"arch,omitempty"`
}

type paramInfo struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
}

type dataInfo struct {
	Examples int `json:"examples"`
	Dim      int `json:"dim"`
	Classes  int `json:"classes"`
}

// moduleResult is what a module writes through output_write, as JSON, or
// builds with ABI v3's result_examples and result_metric.
type moduleResult struct {
	NumExamples int                `json:"num_examples"`
	Metrics     map[string]float64 `json:"metrics"`
}

// maxOutputBytes bounds a module's result document; weights travel in tensors, not here.
const maxOutputBytes = 64 << 10

// maxMetrics bounds the number of metrics one result may carry, and
// maxMetricName the bytes of a metric's name.
const (
	maxMetrics    = 64
	maxMetricName = 64
)

// requestHyper is the task's hyper-parameter JSON as the request document
// carries it: compacted as encoding/json writes a RawMessage, "{}" for none.
// sgd_hyper parses these very bytes, so it reads what the document says.
func requestHyper(raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 {
		return json.RawMessage("{}"), nil
	}
	// Marshal validates as it compacts: one pass over the task's bytes.
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: hyper-parameters are not JSON", ErrInvalidCall)
	}
	return b, nil
}

// decodeResult parses and validates a module's result document. examples is the
// size of the local dataset: a module may not claim more examples than it was given,
// since the server weights updates by this count.
func decodeResult(b []byte, examples int) (moduleResult, error) {
	var r moduleResult
	if len(b) == 0 {
		return r, fmt.Errorf("%w: module wrote no result", ErrResult)
	}
	if len(b) > maxOutputBytes {
		return r, fmt.Errorf("%w: result is %d bytes, limit %d", ErrResult, len(b), maxOutputBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("%w: %v", ErrResult, err)
	}
	if dec.More() {
		return r, fmt.Errorf("%w: trailing data after result", ErrResult)
	}
	if r.NumExamples < 0 || r.NumExamples > examples {
		return r, fmt.Errorf("%w: num_examples %d not in [0,%d]", ErrResult, r.NumExamples, examples)
	}
	if len(r.Metrics) > maxMetrics {
		return r, fmt.Errorf("%w: %d metrics, limit %d", ErrResult, len(r.Metrics), maxMetrics)
	}
	for k, v := range r.Metrics {
		if k == "" || len(k) > maxMetricName {
			return r, fmt.Errorf("%w: metric name %q", ErrResult, k)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return r, fmt.Errorf("%w: metric %q is %v", ErrResult, k, v)
		}
	}
	return r, nil
}
