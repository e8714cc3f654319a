package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// crdSchema is one served version of a CRD, ready to check objects the way
// the API server does on create: prune unknown fields, default, validate
// the OpenAPI schema, then the x-kubernetes-validations rules.
type crdSchema struct {
	structural *structuralschema.Structural
	validator  validation.SchemaValidator
	cel        *cel.Validator
}

// crdFiles are the CRDs the rendered objects must satisfy, by kind, from
// the modules the API types come from.
var crdFiles = map[string][2]string{
	"JobSet":         {"sigs.k8s.io/jobset", "jobset.x-k8s.io_jobsets.yaml"},
	"ResourceFlavor": {"sigs.k8s.io/kueue", "kueue.x-k8s.io_resourceflavors.yaml"},
	"ClusterQueue":   {"sigs.k8s.io/kueue", "kueue.x-k8s.io_clusterqueues.yaml"},
	"LocalQueue":     {"sigs.k8s.io/kueue", "kueue.x-k8s.io_localqueues.yaml"},
}

// crdFile reads one CRD file, f being its module and file name, from the
// module's directory in the module cache (looked up once per module, into
// dirs). Without it the test skips and says how to get it.
func crdFile(t *testing.T, dirs map[string]string, f [2]string) (path string, raw []byte) {
	t.Helper()
	dir, ok := dirs[f[0]]
	if !ok {
		b, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", f[0]).Output()
		dir = strings.TrimSpace(string(b))
		if err != nil || dir == "" {
			t.Skipf("CRDs not reachable: go list -m %s: %v; run go mod download %s", f[0], err, f[0])
		}
		dirs[f[0]] = dir
	}
	path = filepath.Join(dir, "config", "components", "crd", "bases", f[1])
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("CRD not reachable: %v; run go mod download %s", err, f[0])
	}
	return path, raw
}

// loadSchemas reads the CRDs from the module cache. Without them (no
// module cache, e.g. a vendored build) the test skips and says why.
func loadSchemas(t *testing.T) map[string]crdSchema {
	t.Helper()
	dirs := map[string]string{}
	out := map[string]crdSchema{}
	for kind, f := range crdFiles {
		path, raw := crdFile(t, dirs, f)
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, v := range crd.Spec.Versions {
			if !v.Storage {
				continue
			}
			var internal apiextensions.JSONSchemaProps
			if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
				t.Fatalf("%s: convert: %v", path, err)
			}
			st, err := structuralschema.NewStructural(&internal)
			if err != nil {
				t.Fatalf("%s: structural: %v", path, err)
			}
			val, _, err := validation.NewSchemaValidator(&internal)
			if err != nil {
				t.Fatalf("%s: validator: %v", path, err)
			}
			out[crd.Spec.Group+"/"+v.Name+"/"+kind] = crdSchema{st, val, cel.NewValidator(st, true, celconfig.PerCallLimit)}
		}
	}
	return out
}

// check returns every reason the API server would refuse obj, or drop
// part of it.
func (s crdSchema) check(obj map[string]any) error {
	var errs []string
	obj = runtime.DeepCopyJSON(obj)
	if pruned := pruning.PruneWithOptions(obj, s.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}); len(pruned) > 0 {
		errs = append(errs, fmt.Sprintf("unknown fields dropped: %v", pruned))
	}
	defaulting.Default(obj, s.structural)
	for _, e := range validation.ValidateCustomResource(nil, obj, s.validator) {
		errs = append(errs, e.Error())
	}
	if s.cel != nil {
		celErrs, _ := s.cel.Validate(context.Background(), field.NewPath(""), s.structural, obj, nil, celconfig.RuntimeCELCostBudget)
		for _, e := range celErrs {
			errs = append(errs, e.Error())
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "\n"))
	}
	return nil
}

func checkAll(t *testing.T, schemas map[string]crdSchema, where string, objs []map[string]any) {
	t.Helper()
	for _, o := range objs {
		apiVersion, _ := o["apiVersion"].(string)
		kind, _ := o["kind"].(string)
		s, ok := schemas[apiVersion+"/"+kind]
		if !ok {
			t.Errorf("%s: no CRD schema for %s %s", where, apiVersion, kind)
			continue
		}
		if err := s.check(o); err != nil {
			t.Errorf("%s: %s %v refused by its CRD schema:\n%v", where, kind, o["metadata"], err)
		}
	}
}

func TestRenderedObjectsMatchCRDs(t *testing.T) {
	schemas := loadSchemas(t)
	for _, j := range []struct{ name string }{{"cpu"}, {"gpu"}} {
		job := cpuJob()
		if j.name == "gpu" {
			job = gpuJob()
		}
		js, err := Render(job, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		m, err := ToUnstructured(js)
		if err != nil {
			t.Fatal(err)
		}
		checkAll(t, schemas, j.name, []map[string]any{m})
	}
	flavors, err := Flavors(testQueueConfig())
	if err != nil {
		t.Fatal(err)
	}
	cq, lq, err := TenantQueues("research", testTenant(), testQueueConfig())
	if err != nil {
		t.Fatal(err)
	}
	var objs []map[string]any
	for _, o := range []runtime.Object{flavors[0], flavors[1], cq, lq} {
		m, err := ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, m)
	}
	checkAll(t, schemas, "tenant", objs)
}

// TestSchemaCatchesMistakes shows the check can fail: a misspelt field and
// a value outside an enum are both refused.
func TestSchemaCatchesMistakes(t *testing.T) {
	schemas := loadSchemas(t)
	js, err := Render(cpuJob(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	m, err := ToUnstructured(js)
	if err != nil {
		t.Fatal(err)
	}
	spec := m["spec"].(map[string]any)
	spec["failurePolicy"].(map[string]any)["maxRestart"] = int64(3)
	spec["failurePolicy"].(map[string]any)["rules"].([]any)[0].(map[string]any)["action"] = "RestartEverything"
	err = schemas["jobset.x-k8s.io/v1alpha2/JobSet"].check(m)
	if err == nil || !strings.Contains(err.Error(), "maxRestart") || !strings.Contains(err.Error(), "RestartEverything") {
		t.Fatalf("want both mistakes reported, got %v", err)
	}
}

// TestDeployQueuesMatchCRDs validates the example queues under
// deploy/kubernetes/pool and that their references resolve.
func TestDeployQueuesMatchCRDs(t *testing.T) {
	schemas := loadSchemas(t)
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "deploy", "kubernetes", "pool", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests under deploy/kubernetes/pool: %v", err)
	}
	names := map[string]bool{}
	var objs []map[string]any
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			var o map[string]any
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o == nil {
				continue
			}
			objs = append(objs, o)
			md, _ := o["metadata"].(map[string]any)
			names[fmt.Sprint(o["kind"], "/", md["name"])] = true
		}
	}
	checkAll(t, schemas, "deploy", objs)
	for _, o := range objs {
		b, _ := json.Marshal(o["spec"])
		var spec struct {
			ClusterQueue   string `json:"clusterQueue"`
			ResourceGroups []struct {
				Flavors []struct{ Name string } `json:"flavors"`
			} `json:"resourceGroups"`
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		if spec.ClusterQueue != "" && !names["ClusterQueue/"+spec.ClusterQueue] {
			t.Errorf("LocalQueue names ClusterQueue %s, not in the manifests", spec.ClusterQueue)
		}
		for _, g := range spec.ResourceGroups {
			for _, f := range g.Flavors {
				if !names["ResourceFlavor/"+f.Name] {
					t.Errorf("ClusterQueue names ResourceFlavor %s, not in the manifests", f.Name)
				}
			}
		}
	}
	for _, want := range []string{"ResourceFlavor/default", "ResourceFlavor/gpu", "ClusterQueue/fl-research", "LocalQueue/fl-research"} {
		if !names[want] {
			t.Errorf("deploy/kubernetes/pool lacks %s", want)
		}
	}
}
