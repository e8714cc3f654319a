package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/fleetlearn/fleetlearn/server"
)

// grafanaDashboard is the part of a Grafana dashboard the checks read.
type grafanaDashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *dsRef          `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaPanel struct {
	ID         int     `json:"id"`
	Type       string  `json:"type"`
	Title      string  `json:"title"`
	Datasource *dsRef  `json:"datasource"`
	GridPos    *gridXY `json:"gridPos"`
	Targets    []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource *dsRef `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type gridXY struct{ X, Y, W, H int }

// object is what every Kubernetes object starts with.
type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
}

// prometheusRule is a monitoring.coreos.com/v1 PrometheusRule, decoded
// strictly: a misspelt field fails the test.
type prometheusRule struct {
	object `json:",inline"`
	Spec   struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Record      string            `json:"record"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// serviceMonitor is a monitoring.coreos.com/v1 ServiceMonitor.
type serviceMonitor struct {
	object `json:",inline"`
	Spec   struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

var metricName = regexp.MustCompile(`\bfleetlearn_[a-zA-Z0-9_:]*`)

// unknownMetrics are the fleetlearn_* names expr refers to that the
// aggregator does not serve; a histogram's series are its name with
// _bucket, _sum or _count.
func unknownMetrics(expr string, known []string) []string {
	var out []string
	for _, n := range metricName.FindAllString(expr, -1) {
		base := n
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suf); ok && slices.Contains(known, b) {
				base = b
			}
		}
		if !slices.Contains(known, base) {
			out = append(out, n)
		}
	}
	return out
}

func TestMetricNamesKnown(t *testing.T) {
	known := server.MetricNames()
	for _, want := range []string{"fleetlearn_rounds_total", "fleetlearn_devices", "fleetlearn_report_refusals_total",
		"fleetlearn_secagg_stage_duration_seconds", "fleetlearn_pool_jobs", "fleetlearn_pool_usage_gpu_seconds_total"} {
		if !slices.Contains(known, want) {
			t.Errorf("server.MetricNames lacks %s: %v", want, known)
		}
	}
	if got := unknownMetrics(`rate(fleetlearn_round_duration_seconds_bucket[5m]) + fleetlearn_no_such_total`, known); !slices.Equal(got, []string{"fleetlearn_no_such_total"}) {
		t.Errorf("unknownMetrics found %v, want only fleetlearn_no_such_total", got)
	}
}

// TestGrafanaDashboard: the dashboard parses, every panel has a unique id
// and a place on the grid, queries the ${datasource} variable and names
// only metrics the aggregator serves.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("grafana", "fleetlearn-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("dashboard uid %q title %q schemaVersion %d: want both set and schema 36 or later", d.UID, d.Title, d.SchemaVersion)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" {
			hasDS = v.Type == "datasource" && string(v.Query) == `"prometheus"`
		}
		if v.Datasource != nil && v.Datasource.UID != "${datasource}" {
			t.Errorf("variable %s queries data source %q, want ${datasource}", v.Name, v.Datasource.UID)
		}
	}
	if !hasDS {
		t.Error("dashboard has no Prometheus data source variable named datasource")
	}
	known := server.MetricNames()
	ids := map[int]string{}
	var queries int
	var check func(p grafanaPanel)
	check = func(p grafanaPanel) {
		if prev, dup := ids[p.ID]; dup || p.ID <= 0 {
			t.Errorf("panel %q: id %d is not positive or also %q's", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 || g.Y < 0 {
			t.Errorf("panel %q: gridPos %+v, want a width and height within the 24 columns", p.Title, p.GridPos)
		}
		for _, c := range p.Panels {
			check(c)
		}
		if p.Type == "row" {
			return
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: data source %+v, want the prometheus ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			if q.Datasource != nil && q.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q query %s: data source %q, want ${datasource}", p.Title, q.RefID, q.Datasource.UID)
			}
			if !metricName.MatchString(q.Expr) {
				t.Errorf("panel %q query %s names no fleetlearn metric: %s", p.Title, q.RefID, q.Expr)
			}
			if u := unknownMetrics(q.Expr, known); len(u) > 0 {
				t.Errorf("panel %q query %s: the aggregator serves no %v", p.Title, q.RefID, u)
			}
		}
	}
	for _, p := range d.Panels {
		check(p)
	}
	if queries == 0 {
		t.Fatal("dashboard has no queries")
	}
}

// renderMonitoring renders deploy/kubernetes/monitoring into its objects' JSON, by kind.
func renderMonitoring(t *testing.T) map[string][][]byte {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join("kubernetes", "monitoring"))
	if err != nil {
		t.Fatalf("kustomize monitoring: %v", err)
	}
	out := map[string][][]byte{}
	for _, r := range rm.Resources() {
		js, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		out[r.GetKind()] = append(out[r.GetKind()], js)
	}
	return out
}

// TestPrometheusRule: the rules decode strictly, every alert waits (for),
// has a severity, a summary and a description, and names only metrics the
// aggregator serves; the ServiceMonitor scrapes the Service's metrics port.
func TestPrometheusRule(t *testing.T) {
	objs := renderMonitoring(t)
	if len(objs) != 2 || len(objs["PrometheusRule"]) != 1 || len(objs["ServiceMonitor"]) != 1 {
		t.Fatalf("monitoring renders %d kinds, want one PrometheusRule and one ServiceMonitor", len(objs))
	}
	var pr prometheusRule
	if err := yaml.UnmarshalStrict(objs["PrometheusRule"][0], &pr); err != nil {
		t.Fatalf("PrometheusRule: %v", err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Metadata.Namespace != namespace {
		t.Errorf("PrometheusRule is %s in %q, want monitoring.coreos.com/v1 in %s", pr.APIVersion, pr.Metadata.Namespace, namespace)
	}
	known := server.MetricNames()
	alerts := map[string]bool{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule without alert (recording rules are not expected here): %s", g.Name, r.Expr)
				continue
			}
			if alerts[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			alerts[r.Alert] = true
			switch sev := r.Labels["severity"]; {
			case r.For == "":
				t.Errorf("alert %s has no for", r.Alert)
			case sev != "critical" && sev != "warning":
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, sev)
			case r.Annotations["summary"] == "" || r.Annotations["description"] == "":
				t.Errorf("alert %s lacks a summary or description annotation", r.Alert)
			}
			if u := unknownMetrics(r.Expr, known); len(u) > 0 {
				t.Errorf("alert %s: the aggregator serves no %v", r.Alert, u)
			}
		}
	}
	for _, want := range []string{"FleetlearnTargetDown", "FleetlearnAuditRecordingFailures", "FleetlearnRoundCloseFailures",
		"FleetlearnRoundsAbandonedRatioHigh", "FleetlearnNoDevicesOnline", "FleetlearnEpsilonNearBudget",
		"FleetlearnPoolJobsQueuedTooLong", "FleetlearnPoolNoWorkers"} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}

	var sm serviceMonitor
	if err := yaml.UnmarshalStrict(objs["ServiceMonitor"][0], &sm); err != nil {
		t.Fatalf("ServiceMonitor: %v", err)
	}
	base := renderOverlay(t, "base")
	var matched bool
	for _, svc := range base.services {
		selected := len(sm.Spec.Selector.MatchLabels) > 0
		for k, v := range sm.Spec.Selector.MatchLabels {
			selected = selected && svc.Labels[k] == v
		}
		if !selected {
			continue
		}
		for _, p := range svc.Spec.Ports {
			for _, e := range sm.Spec.Endpoints {
				matched = matched || p.Name == e.Port && e.Path == "/metrics"
			}
		}
	}
	if !matched || sm.Metadata.Namespace != namespace {
		t.Errorf("ServiceMonitor in %q selects %v port %+v: no Service of the base overlay in %s serves it", sm.Metadata.Namespace,
			sm.Spec.Selector.MatchLabels, sm.Spec.Endpoints, namespace)
	}
}
