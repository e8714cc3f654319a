//go:build linux

package kubetest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/fleetlearn/fleetlearn/internal/freeport"
	"github.com/fleetlearn/fleetlearn/internal/testtool"
)

// Start runs the whole control plane for t and stops it at t.Cleanup. It
// skips in -short mode, and without the built programs outside CI
// (testtool.Find; under CI it fails). It returns once the API server is
// ready, the JobSet and Kueue CRDs are served and both controllers'
// webhooks answer the API server; nodes come from AddNode.
func Start(t testing.TB) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("kubetest: runs a whole Kubernetes control plane; skipped in -short mode")
	}
	bins := map[string]string{}
	for _, tool := range testtool.ControlPlane {
		bins[tool.Name] = testtool.Find(t, tool)
	}
	c := &Cluster{Dir: t.TempDir()}
	// Registered first, so it runs last: after every component is killed
	// and its log complete.
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range c.components {
				t.Logf("kubetest: %s log (end):\n%s", name, c.Logs(name))
			}
		}
	})
	p := newPKI(t, c.Dir)
	writeKueueMetricsCerts(t, p)

	c.startAPIServer(t, bins, p)
	kubeconfig := filepath.Join(c.Dir, "admin.kubeconfig")
	writeKubeconfig(t, kubeconfig, c.Config.Host, p)
	// The CRDs come before the controller manager: its garbage collector
	// watches the resources discovery lists at its start and learns of
	// later ones only at a resync, half a minute on, until which deleting
	// a JobSet would leave its Jobs and pods behind.
	c.installCRDs(t, testtool.FilesDir(bins[testtool.JobSet.Name]), testtool.FilesDir(bins[testtool.Kueue.Name]))
	c.startKubeComponents(t, bins, p, kubeconfig)
	c.startControllers(t, bins, p, kubeconfig)
	c.startKWOK(t, bins[testtool.KWOK.Name], kubeconfig)
	return c
}

// startAPIServer starts etcd and kube-apiserver and sets c's clients once
// /readyz answers ok.
func (c *Cluster) startAPIServer(t testing.TB, bins map[string]string, p *pki) {
	t.Helper()
	clientURL := "http://" + freeport.Addr(t)
	peerURL := "http://" + freeport.Addr(t)
	c.start(t, "etcd", bins[testtool.Etcd.Name], nil,
		"--name=default", "--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		// A test's data need not survive a crash of the machine.
		"--unsafe-no-fsync")

	tokenFile := filepath.Join(c.Dir, "tokens.csv")
	writeFile(t, tokenFile, []byte(p.token+`,kubetest-admin,kubetest-admin,"system:masters"`+"\n"))
	port := freeport.Must(t)
	c.start(t, "kube-apiserver", bins[testtool.KubeAPIServer.Name], nil,
		"--etcd-servers="+clientURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(port),
		// The endpoint reconciler refuses a loopback address; nothing
		// reaches the API server through the kubernetes Service here.
		"--endpoint-reconciler-type=none",
		"--tls-cert-file="+p.certFile, "--tls-private-key-file="+p.keyFile,
		"--token-auth-file="+tokenFile, "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file="+p.saPub,
		"--service-account-signing-key-file="+p.saKey, "--service-cluster-ip-range=10.96.0.0/16",
		// KWOK's pods run nothing that would read a service account
		// token, and without the plugin no pod waits for its namespace's
		// default ServiceAccount.
		"--disable-admission-plugins=ServiceAccount")

	// No timeout: it would cut watches short. The calls of this package
	// are bounded by Guard.
	c.Config = &rest.Config{Host: "https://127.0.0.1:" + strconv.Itoa(port), BearerToken: p.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: p.caPEM}, QPS: 100, Burst: 200}
	var err error
	if c.Dynamic, err = dynamic.NewForConfig(c.Config); err != nil {
		t.Fatalf("kubetest: dynamic client: %v", err)
	}
	if c.Clients, err = kubernetes.NewForConfig(c.Config); err != nil {
		t.Fatalf("kubetest: typed client: %v", err)
	}
	transport, err := rest.TransportFor(c.Config)
	if err != nil {
		t.Fatalf("kubetest: client transport: %v", err)
	}
	c.waitHealthy(t, "kube-apiserver", &http.Client{Transport: transport, Timeout: 5 * time.Second}, c.Config.Host+"/readyz")
}

// startKubeComponents starts kube-controller-manager (the Job, garbage
// collector, node lifecycle and volume binding controllers among others)
// and kube-scheduler, and waits until both are healthy.
func (c *Cluster) startKubeComponents(t testing.TB, bins map[string]string, p *pki, kubeconfig string) {
	t.Helper()
	common := func(port int) []string {
		return []string{
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig,
			// Callers authenticate by token, not by client certificate:
			// nothing to read from the extension-apiserver-authentication
			// ConfigMap, which an API server without a client CA never
			// writes.
			"--authentication-skip-lookup",
			"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
			"--tls-cert-file=" + p.certFile, "--tls-private-key-file=" + p.keyFile,
			"--leader-elect=false",
		}
	}
	kcmPort, schedPort := freeport.Must(t), freeport.Must(t)
	c.start(t, "kube-controller-manager", bins[testtool.KubeControllerManager.Name], nil,
		append(common(kcmPort),
			"--service-account-private-key-file="+p.saKey, "--root-ca-file="+p.caFile)...)
	c.start(t, "kube-scheduler", bins[testtool.KubeScheduler.Name], nil, common(schedPort)...)
	hc := p.httpsClient()
	c.waitHealthy(t, "kube-controller-manager", hc, "https://127.0.0.1:"+strconv.Itoa(kcmPort)+"/healthz")
	c.waitHealthy(t, "kube-scheduler", hc, "https://127.0.0.1:"+strconv.Itoa(schedPort)+"/healthz")
}

// installCRDs creates every CRD under config/components/crd/bases of each
// module's files and waits until each is established and its storage
// version served.
func (c *Cluster) installCRDs(t testing.TB, filesDirs ...string) {
	t.Helper()
	ctx, cancel := bounded(t)
	defer cancel()
	cs, err := apiextensionsclient.NewForConfig(c.Config)
	if err != nil {
		t.Fatalf("kubetest: apiextensions client: %v", err)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, dir := range filesDirs {
		files, err := filepath.Glob(filepath.Join(dir, "config", "components", "crd", "bases", "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("kubetest: no CRDs in %s (%v): rebuild the tools with `%s`", dir, err, testtool.BuildCommand)
		}
		for _, f := range files {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := yaml.UnmarshalStrict(readFile(t, f), &crd); err != nil {
				t.Fatalf("kubetest: %s: %v", f, err)
			}
			got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("kubetest: create CRD %s: %v", crd.Name, err)
			}
			crds = append(crds, got)
		}
	}
	for _, crd := range crds {
		ctx, cancel := bounded(t)
		defer cancel()
		c.WaitFor(t, "CRD "+crd.Name+" established", func() (bool, string, error) {
			got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.NamesAccepted && cond.Status == apiextensionsv1.ConditionFalse {
					return false, "", fmt.Errorf("names not accepted: %s", cond.Message)
				}
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, "", nil
				}
			}
			return false, fmt.Sprint(got.Status.Conditions), nil
		})
		// Established can come a moment before the resource is served.
		for _, v := range crd.Spec.Versions {
			if !v.Storage {
				continue
			}
			gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural}
			c.WaitFor(t, "resource "+gvr.String()+" served", func() (bool, string, error) {
				_, err := c.Dynamic.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
				if err != nil {
					return false, err.Error(), nil
				}
				return true, "", nil
			})
		}
	}
}

// controller is how Start runs the JobSet or the Kueue controller manager.
type controller struct {
	tool testtool.Tool
	// config is the controller's configuration file, given the webhook
	// port, the certificate directory and the metrics and health
	// addresses.
	config func(webhookPort int, certDir, metricsAddr, healthAddr string) string
	args   []string
	// keep says which of the module's webhooks, by path, to register.
	keep func(path string) bool
	// objectSelector, when it returns one, restricts the webhook of that
	// path to the objects it selects.
	objectSelector func(path string) *metav1.LabelSelector
}

var controllers = []controller{
	{
		tool: testtool.JobSet,
		config: func(port int, certDir, metricsAddr, healthAddr string) string {
			return fmt.Sprintf(`apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %q
metrics:
  bindAddress: %q
  certDir: %q
health:
  healthProbeBindAddress: %q
`, port, certDir, metricsAddr, certDir, healthAddr)
		},
		keep: func(string) bool { return true },
		// As the module's config/components/webhook/patches do: JobSet's
		// pod webhooks see only the pods of JobSets.
		objectSelector: func(path string) *metav1.LabelSelector {
			if path != "/mutate--v1-pod" && path != "/validate--v1-pod" {
				return nil
			}
			return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "jobset.sigs.k8s.io/jobset-name", Operator: metav1.LabelSelectorOpExists}}}
		},
	},
	{
		tool: testtool.Kueue,
		config: func(port int, certDir, metricsAddr, healthAddr string) string {
			return fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %q
metrics:
  bindAddress: %q
health:
  healthProbeBindAddress: %q
integrations:
  frameworks:
  - batch/job
  - jobset.x-k8s.io/jobset
`, port, certDir, metricsAddr, healthAddr)
		},
		// The visibility API server would want its own certificate and an
		// APIService; nothing here lists pending workloads through it.
		args: []string{"--feature-gates=VisibilityOnDemand=false"},
		// Only the webhooks of the integrations enabled above and of
		// Kueue's own objects: the others (pods, deployments, Kubeflow
		// and Ray jobs) would answer for frameworks Kueue does not run.
		keep: func(path string) bool {
			return strings.Contains(path, "-kueue-x-k8s-io-") || strings.Contains(path, "-batch-v1-job") ||
				strings.Contains(path, "-jobset-x-k8s-io-")
		},
		objectSelector: func(string) *metav1.LabelSelector { return nil },
	},
}

// startControllers starts the JobSet and Kueue controller managers with
// their webhooks on loopback, registers the webhooks by URL and waits
// until the API server reaches both: a dry-run JobSet passes them.
func (c *Cluster) startControllers(t testing.TB, bins map[string]string, p *pki, kubeconfig string) {
	t.Helper()
	ctx, cancel := bounded(t)
	defer cancel()
	type started struct {
		name, health string
	}
	var all []started
	for _, ctl := range controllers {
		name := ctl.tool.Name
		port := freeport.Must(t)
		metricsAddr, healthAddr := freeport.Addr(t), freeport.Addr(t)
		cfgFile := filepath.Join(c.Dir, name+".yaml")
		writeFile(t, cfgFile, []byte(ctl.config(port, p.dir, metricsAddr, healthAddr)))
		c.start(t, name, bins[name], nil, append([]string{"--config=" + cfgFile, "--kubeconfig=" + kubeconfig}, ctl.args...)...)
		c.registerWebhooks(t, ctx, ctl, testtool.FilesDir(bins[name]), port, p.caPEM)
		all = append(all, started{name, "http://" + healthAddr + "/readyz"})
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, s := range all {
		c.waitHealthy(t, s.name, hc, s.health)
	}
	// Ready webhook servers are not yet proof that the API server reaches
	// them (URL, CA bundle): a JobSet create passes both controllers'
	// webhooks.
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
		"metadata": map[string]any{"name": "kubetest-webhook-probe", "namespace": metav1.NamespaceDefault},
		"spec": map[string]any{"suspend": true, "replicatedJobs": []any{map[string]any{
			"name": "probe", "replicas": int64(1),
			"template": map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
				"restartPolicy": "Never",
				"containers":    []any{map[string]any{"name": "probe", "image": "kubetest.invalid/probe"}},
			}}}},
		}}},
	}}
	jobsets := c.Dynamic.Resource(schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"})
	ctx, cancel = bounded(t)
	defer cancel()
	c.WaitFor(t, "the JobSet and Kueue webhooks to answer the API server", func() (bool, string, error) {
		_, err := jobsets.Namespace(metav1.NamespaceDefault).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
}

// registerWebhooks creates the webhook configurations of ctl's module,
// each renamed after the controller and pointing at its loopback port
// instead of an in-cluster Service.
func (c *Cluster) registerWebhooks(t testing.TB, ctx context.Context, ctl controller, filesDir string, port int, caPEM []byte) {
	t.Helper()
	path := filepath.Join(filesDir, "config", "components", "webhook", "manifests.yaml")
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(readFile(t, path)), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatalf("kubetest: %s: %v", path, err)
		}
		if obj.Object == nil {
			continue
		}
		var resource string
		switch obj.GetKind() {
		case "MutatingWebhookConfiguration":
			resource = "mutatingwebhookconfigurations"
		case "ValidatingWebhookConfiguration":
			resource = "validatingwebhookconfigurations"
		default:
			t.Fatalf("kubetest: %s: unexpected %s", path, obj.GetKind())
		}
		obj.SetName(ctl.tool.Name + "-" + obj.GetName())
		hooks, _, err := unstructured.NestedSlice(obj.Object, "webhooks")
		if err != nil {
			t.Fatalf("kubetest: %s: %s: %v", path, obj.GetName(), err)
		}
		var kept []any
		for _, h := range hooks {
			hook, _ := h.(map[string]any)
			svcPath, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			if svcPath == "" {
				t.Fatalf("kubetest: %s: webhook %v has no service path", path, hook["name"])
			}
			if !ctl.keep(svcPath) {
				continue
			}
			hook["clientConfig"] = map[string]any{
				"url":      "https://127.0.0.1:" + strconv.Itoa(port) + svcPath,
				"caBundle": base64.StdEncoding.EncodeToString(caPEM),
			}
			if sel := ctl.objectSelector(svcPath); sel != nil {
				m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sel)
				if err != nil {
					t.Fatalf("kubetest: %s: %v", path, err)
				}
				hook["objectSelector"] = m
			}
			kept = append(kept, hook)
		}
		obj.Object["webhooks"] = kept
		gvr := admissionv1.SchemeGroupVersion.WithResource(resource)
		if _, err := c.Dynamic.Resource(gvr).Create(ctx, &obj, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("kubetest: create %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// startKWOK starts KWOK on the nodes annotated KWOKNodeAnnotation=fake,
// with stages that make nodes Ready and keep them so, start pods (Running,
// not completing) and delete pods marked for deletion.
func (c *Cluster) startKWOK(t testing.TB, bin, kubeconfig string) {
	t.Helper()
	var stages []byte
	for _, f := range testtool.KWOK.Files {
		if len(stages) > 0 {
			stages = append(stages, "\n---\n"...)
		}
		stages = append(stages, readFile(t, filepath.Join(testtool.FilesDir(bin), filepath.FromSlash(f)))...)
	}
	cfgFile := filepath.Join(c.Dir, "kwok-stages.yaml")
	writeFile(t, cfgFile, stages)
	// HOME keeps a developer's ~/.kwok/kwok.yaml, which KWOK would load as
	// well, out of the test.
	c.start(t, "kwok", bin, []string{"HOME=" + c.Dir},
		"--kubeconfig="+kubeconfig, "--config="+cfgFile,
		"--manage-nodes-with-annotation-selector="+KWOKNodeAnnotation+"=fake")
}

// start runs bin with args (and env added to the test's environment),
// logging to <name>.log in c.Dir, and kills it at cleanup whatever the
// test's outcome. The kernel kills it too if the test binary dies.
func (c *Cluster) start(t testing.TB, name, bin string, env []string, args ...string) {
	t.Helper()
	logf, err := os.Create(filepath.Join(c.Dir, name+".log"))
	if err != nil {
		t.Fatalf("kubetest: start %s: %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("kubetest: start %s: %v", name, err)
	}
	p := &proc{name: name, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	c.components = append(c.components, name)
	c.procs = append(c.procs, p)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
}

// waitHealthy waits until url answers 200 OK through hc.
func (c *Cluster) waitHealthy(t testing.TB, name string, hc *http.Client, url string) {
	t.Helper()
	c.WaitFor(t, name+" healthy ("+url+")", func() (bool, string, error) {
		resp, err := hc.Get(url)
		if err != nil {
			return false, err.Error(), nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("%d %s", resp.StatusCode, body), nil
	})
}

// kueueMetricsCertDir is where Kueue v0.17 reads its metrics certificate
// when it does not manage certificates itself; the path is fixed in its
// main.
const kueueMetricsCertDir = "/etc/kueue/metrics/certs"

// writeKueueMetricsCerts puts a certificate and key in
// kueueMetricsCertDir unless a valid pair is there already. Concurrent
// clusters (other test binaries) share the directory: files are replaced
// atomically and never removed, and whichever valid pair Kueue loads
// serves only its metrics, which nothing here scrapes.
func writeKueueMetricsCerts(t testing.TB, p *pki) {
	t.Helper()
	crt, key := filepath.Join(kueueMetricsCertDir, "tls.crt"), filepath.Join(kueueMetricsCertDir, "tls.key")
	if _, err := tls.LoadX509KeyPair(crt, key); err == nil {
		return
	}
	err := os.MkdirAll(kueueMetricsCertDir, 0o755)
	// The key first: Kueue reloads the pair when the certificate changes.
	for _, f := range []struct {
		from, to string
		perm     os.FileMode
	}{{p.keyFile, key, 0o600}, {p.certFile, crt, 0o644}} {
		if err != nil {
			break
		}
		var b []byte
		if b, err = os.ReadFile(f.from); err == nil {
			tmp := f.to + ".tmp" + strconv.Itoa(os.Getpid())
			if err = os.WriteFile(tmp, b, f.perm); err == nil {
				err = os.Rename(tmp, f.to)
			}
		}
	}
	if err != nil {
		msg := fmt.Sprintf("kubetest: Kueue reads its metrics certificate from %s, which this user cannot write (%v); run as root, or create the directory writable for this user", kueueMetricsCertDir, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// writeKubeconfig writes a kubeconfig for the administrator's token, which
// every component uses.
func writeKubeconfig(t testing.TB, path, server string, p *pki) {
	t.Helper()
	b, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Config",
		"clusters": []any{map[string]any{"name": "kubetest", "cluster": map[string]any{
			"server": server, "certificate-authority": p.caFile}}},
		"users":           []any{map[string]any{"name": "admin", "user": map[string]any{"token": p.token}}},
		"contexts":        []any{map[string]any{"name": "kubetest", "context": map[string]any{"cluster": "kubetest", "user": "admin"}}},
		"current-context": "kubetest",
	})
	if err != nil {
		t.Fatalf("kubetest: kubeconfig: %v", err)
	}
	writeFile(t, path, b)
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	return b
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
}

// httpsClient trusts p's CA, which signed every serving certificate here.
func (p *pki) httpsClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.caPEM)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}
