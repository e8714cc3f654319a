//go:build linux

// The real-API-server tier runs etcd and kube-apiserver as child
// processes. It is Linux-only because it asks the kernel to kill them
// (Pdeathsig) when the test binary dies, e.g. on a go test -timeout,
// which skips t.Cleanup and would otherwise leave both holding ports.

package kube

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	"sigs.k8s.io/yaml"

	"github.com/fleetlearn/fleetlearn/internal/freeport"
	"github.com/fleetlearn/fleetlearn/internal/testtool"
	"github.com/fleetlearn/fleetlearn/pool"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// startupGuard bounds each wait on the API server (ready, CRD
// established). It only stops a hung test; a healthy start takes seconds.
const startupGuard = 120 * time.Second

// realAssets returns the binaries' paths: the etcd and kube-apiserver that
// internal/testtool builds from the module proxy (testtool.Find skips
// without them, saying how to build them, or fails under CI).
func realAssets(t *testing.T) (etcd, apiserver string) {
	t.Helper()
	if testing.Short() {
		t.Skip("real API server tier: skipped in -short mode")
	}
	return testtool.Find(t, testtool.Etcd), testtool.Find(t, testtool.KubeAPIServer)
}

// freePort is a port nobody held a moment ago. Another process can take
// it before the child binds; the child then exits and the wait for
// readiness reports its log.
func freePort(t *testing.T) int {
	t.Helper()
	return freeport.Must(t)
}

// child is a started etcd or kube-apiserver.
type child struct {
	name string
	log  string
	done chan struct{}
	err  error
}

// tail is the end of the child's log, for failure messages.
func (c *child) tail() string {
	b, _ := os.ReadFile(c.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// exited reports whether the child has ended, and how.
func (c *child) exited() (bool, error) {
	select {
	case <-c.done:
		return true, c.err
	default:
		return false, nil
	}
}

// startChild runs bin with args, logging to a file in dir, and kills it
// at cleanup whatever the test's outcome.
func startChild(t *testing.T, dir, bin string, args ...string) *child {
	t.Helper()
	c := &child{name: filepath.Base(bin), log: filepath.Join(dir, filepath.Base(bin)+".log"), done: make(chan struct{})}
	logf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", c.name, err)
	}
	go func() {
		c.err = cmd.Wait()
		logf.Close()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("%s log (end):\n%s", c.name, c.tail())
		}
	})
	return c
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// serverCerts writes a CA and a serving certificate for 127.0.0.1 into
// dir, so the client checks the server it talks to, and returns the CA.
func serverCerts(t *testing.T, dir string) (caPEM []byte, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleetlearn-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "serving.crt"), filepath.Join(dir, "serving.key")
	writePEM(t, certFile, "CERTIFICATE", leafDER)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), certFile, keyFile
}

// serviceAccountKeys writes the key pair kube-apiserver requires to sign
// and verify service account tokens.
func serviceAccountKeys(t *testing.T, dir string) (pubFile, keyFile string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubFile, keyFile = filepath.Join(dir, "sa.pub"), filepath.Join(dir, "sa.key")
	writePEM(t, pubFile, "PUBLIC KEY", pubDER)
	writePEM(t, keyFile, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key))
	return pubFile, keyFile
}

// startAPIServer starts etcd and kube-apiserver and returns a client
// config for an admin once /readyz answers ok.
func startAPIServer(t *testing.T, etcdBin, apiserverBin string) *rest.Config {
	t.Helper()
	dir := t.TempDir()
	clientPort, peerPort := freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	etcd := startChild(t, dir, etcdBin,
		"--name=default", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL, "--unsafe-no-fsync")

	caPEM, certFile, keyFile := serverCerts(t, dir)
	saPub, saKey := serviceAccountKeys(t, dir)
	tokenBuf := make([]byte, 24)
	if _, err := rand.Read(tokenBuf); err != nil {
		t.Fatal(err)
	}
	token := fmt.Sprintf("%x", tokenBuf)
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+`,fleetlearn-test,fleetlearn-test,"system:masters"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	apiserver := startChild(t, dir, apiserverBin,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		// The endpoint reconciler refuses a loopback address; nothing here
		// needs the kubernetes Service's endpoints.
		"--endpoint-reconciler-type=none", "--secure-port="+strconv.Itoa(port),
		"--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile, "--cert-dir="+filepath.Join(dir, "certs"),
		"--token-auth-file="+tokenFile, "--authorization-mode=AlwaysAllow",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file="+saPub,
		"--service-account-signing-key-file="+saKey, "--service-cluster-ip-range=10.0.0.0/24",
		"--disable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ServiceAccount")

	cfg := &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", port), BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}, QPS: 100, Burst: 200, Timeout: 30 * time.Second}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: transport, Timeout: 5 * time.Second}
	var last string
	waitFor(t, "kube-apiserver /readyz", func() (bool, error) {
		for _, c := range []*child{etcd, apiserver} {
			if done, err := c.exited(); done {
				return false, fmt.Errorf("%s exited (%v) before the API server was ready:\n%s", c.name, err, c.tail())
			}
		}
		resp, err := hc.Get(cfg.Host + "/readyz")
		if err != nil {
			last = err.Error()
			return false, nil
		}
		defer resp.Body.Close()
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		last = fmt.Sprintf("%d %s", resp.StatusCode, body.String())
		return resp.StatusCode == http.StatusOK, nil
	}, func() string { return last })
	return cfg
}

// waitFor polls cond every 100 ms until it holds, fails, or startupGuard
// passes; lastSeen says what the last poll saw.
func waitFor(t *testing.T, what string, cond func() (bool, error), lastSeen func() string) {
	t.Helper()
	deadline := time.Now().Add(startupGuard)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: still not there after %v; last: %s", what, startupGuard, lastSeen())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// installCRDs creates the jobset and kueue CRDs from the module cache (the
// files schema_test.go checks against) and waits until each is served.
func installCRDs(t *testing.T, ctx context.Context, cfg *rest.Config, dyn dynamic.Interface) {
	t.Helper()
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{}
	kinds := make([]string, 0, len(crdFiles))
	for k := range crdFiles {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, kind := range kinds {
		path, raw := crdFile(t, dirs, crdFiles[kind])
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{FieldValidation: "Strict"})
		if err != nil {
			t.Fatalf("create CRD %s: %v", crd.Name, err)
		}
		crds = append(crds, got)
	}
	for _, crd := range crds {
		var last string
		waitFor(t, "CRD "+crd.Name+" established", func() (bool, error) {
			got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.NamesAccepted && c.Status == apiextensionsv1.ConditionFalse {
					return false, fmt.Errorf("names not accepted: %s", c.Message)
				}
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			last = fmt.Sprint(got.Status.Conditions)
			return false, nil
		}, func() string { return last })
		// Established can come a moment before the resource is served.
		// Only the storage version is listed: it is the one Fleetlearn
		// renders, and older served versions answer with deprecation
		// warnings.
		for _, v := range crd.Spec.Versions {
			if !v.Storage {
				continue
			}
			gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural}
			waitFor(t, "resource "+gvr.String()+" served", func() (bool, error) {
				_, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
				if err != nil {
					last = err.Error()
					if apierrors.IsNotFound(err) {
						return false, nil
					}
					return false, err
				}
				return true, nil
			}, func() string { return last })
		}
	}
}

var resources = map[string]string{
	"JobSet": "jobsets", "ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
	"Namespace": "namespaces",
}

// create sends obj as the controller would (dynamic client) with strict
// field validation, so an unknown field is an error and not silently
// pruned.
func create(ctx context.Context, dyn dynamic.Interface, obj map[string]any) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(obj)}
	gvk := u.GroupVersionKind()
	gvr := gvk.GroupVersion().WithResource(resources[gvk.Kind])
	opts := metav1.CreateOptions{FieldValidation: "Strict"}
	if ns := u.GetNamespace(); ns != "" {
		return dyn.Resource(gvr).Namespace(ns).Create(ctx, u, opts)
	}
	return dyn.Resource(gvr).Create(ctx, u, opts)
}

// missing lists where got lacks or changes a value sent in want: what the
// server dropped or rewrote. Values the server only added are fine
// (defaults, metadata); nulls in want are unset fields.
func missing(path string, want, got any) []string {
	switch w := want.(type) {
	case nil:
		return nil
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: sent an object, read back %T", path, got)}
		}
		var out []string
		for k, v := range w {
			out = append(out, missing(path+"."+k, v, g[k])...)
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{fmt.Sprintf("%s: sent %d items, read back %v", path, len(w), got)}
		}
		var out []string
		for i := range w {
			out = append(out, missing(fmt.Sprintf("%s[%d]", path, i), w[i], g[i])...)
		}
		return out
	default:
		if !reflect.DeepEqual(want, got) {
			return []string{fmt.Sprintf("%s: sent %v (%T), read back %v (%T)", path, want, want, got, got)}
		}
		return nil
	}
}

// TestRealAPIServer sends the rendered objects to a real kube-apiserver
// with the jobset and kueue CRDs installed: the server's own pruning,
// defaulting, OpenAPI validation and CEL rules decide, not a copy of them.
// No JobSet or Kueue controller runs, so nothing is admitted or started.
func TestRealAPIServer(t *testing.T) {
	etcdBin, apiserverBin := realAssets(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := startAPIServer(t, etcdBin, apiserverBin)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	installCRDs(t, ctx, cfg, dyn)

	toMap := func(t *testing.T, o runtime.Object) map[string]any {
		t.Helper()
		m, err := ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	sendAndReadBack := func(t *testing.T, where string, sent map[string]any) *unstructured.Unstructured {
		t.Helper()
		created, err := create(ctx, dyn, sent)
		if err != nil {
			t.Fatalf("%s: the API server refused %v %v: %v", where, sent["kind"], sent["metadata"], err)
		}
		gvk := created.GroupVersionKind()
		r := dyn.Resource(gvk.GroupVersion().WithResource(resources[gvk.Kind]))
		var got *unstructured.Unstructured
		if ns := created.GetNamespace(); ns != "" {
			got, err = r.Namespace(ns).Get(ctx, created.GetName(), metav1.GetOptions{})
		} else {
			got, err = r.Get(ctx, created.GetName(), metav1.GetOptions{})
		}
		if err != nil {
			t.Fatalf("%s: read back %s %s: %v", where, gvk.Kind, created.GetName(), err)
		}
		for _, d := range missing(gvk.Kind, sent, got.Object) {
			t.Errorf("%s: %s", where, d)
		}
		return got
	}

	ns := testConfig().Namespace
	sendAndReadBack(t, "namespace", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})

	t.Run("tenant", func(t *testing.T) {
		flavors, err := Flavors(testQueueConfig())
		if err != nil {
			t.Fatal(err)
		}
		cq, lq, err := TenantQueues("research", testTenant(), testQueueConfig())
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []runtime.Object{flavors[0], flavors[1], cq, lq} {
			sendAndReadBack(t, "tenant", toMap(t, o))
		}
	})

	for _, tc := range []struct {
		name string
		job  func(t *testing.T) map[string]any
	}{
		{"cpu", func(t *testing.T) map[string]any {
			js, err := Render(cpuJob(), testConfig())
			if err != nil {
				t.Fatal(err)
			}
			return toMap(t, js)
		}},
		{"gpu", func(t *testing.T) map[string]any {
			js, err := Render(gpuJob(), testConfig())
			if err != nil {
				t.Fatal(err)
			}
			return toMap(t, js)
		}},
	} {
		t.Run("jobset-"+tc.name, func(t *testing.T) {
			got := sendAndReadBack(t, tc.name, tc.job(t))
			st, err := StateOfUnstructured(got)
			if err != nil {
				t.Fatal(err)
			}
			// Without a Kueue controller nothing admits the suspended JobSet.
			if st.State != pool.Queued {
				t.Errorf("%s: state of the stored JobSet is %v (%s), want Queued", tc.name, st.State, st.Reason)
			}
		})
	}

	t.Run("controller", func(t *testing.T) { testRealController(t, ctx, dyn) })

	t.Run("refused", func(t *testing.T) {
		js, err := Render(cpuJob(), testConfig())
		if err != nil {
			t.Fatal(err)
		}
		base := toMap(t, js)
		base["metadata"].(map[string]any)["name"] = "fl-refused"

		// A value outside the failure rule action's enum: OpenAPI validation.
		bad := runtime.DeepCopyJSON(base)
		bad["spec"].(map[string]any)["failurePolicy"].(map[string]any)["rules"].([]any)[0].(map[string]any)["action"] = "RestartEverything"
		wantRefused(t, ctx, dyn, "enum", bad, "RestartEverything")

		// A misspelt field: strict field validation refuses what pruning
		// would drop.
		bad = runtime.DeepCopyJSON(base)
		bad["spec"].(map[string]any)["failurePolicy"].(map[string]any)["maxRestart"] = int64(3)
		wantRefused(t, ctx, dyn, "unknown field", bad, "maxRestart")

		// A flavor that does not cover every covered resource: the
		// ClusterQueue CRD's CEL rule.
		cq, _, err := TenantQueues("cel", testTenant(), testQueueConfig())
		if err != nil {
			t.Fatal(err)
		}
		m := toMap(t, cq)
		rg := m["spec"].(map[string]any)["resourceGroups"].([]any)[0].(map[string]any)
		fl := rg["flavors"].([]any)[0].(map[string]any)
		fl["resources"] = fl["resources"].([]any)[:1]
		if len(rg["coveredResources"].([]any)) < 2 {
			t.Fatalf("test needs a resource group covering several resources, got %v", rg["coveredResources"])
		}
		wantRefused(t, ctx, dyn, "CEL rule", m, "flavors must have the same number of resources as the coveredResources")
	})
}

// wantRefused checks the server answers Invalid (422) or BadRequest
// (strict field validation) naming the mistake.
func wantRefused(t *testing.T, ctx context.Context, dyn dynamic.Interface, what string, obj map[string]any, mention string) {
	t.Helper()
	_, err := create(ctx, dyn, obj)
	if err == nil {
		t.Errorf("%s: the API server accepted %v, want it refused", what, obj["kind"])
		return
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || !(apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)) {
		t.Errorf("%s: want Invalid or BadRequest from the API server, got %v", what, err)
		return
	}
	if !strings.Contains(err.Error(), mention) {
		t.Errorf("%s: refusal does not mention %q: %v", what, mention, err)
		return
	}
	t.Logf("%s: refused: %v", what, err)
}

// testRealController drives the Controller against the real API server in
// a namespace of its own, playing Kueue (unsuspending) and the JobSet
// controller (writing status through the status subresource) by hand.
// The server's defaulting, no-op update detection, label-selected watch
// and status subresource decide what the controller sees.
func testRealController(t *testing.T, ctx context.Context, dyn dynamic.Interface) {
	cfg := testConfig()
	cfg.Namespace = "fleetlearn-ctl"
	if _, err := create(ctx, dyn, map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": cfg.Namespace}}); err != nil {
		t.Fatalf("create namespace %s: %v", cfg.Namespace, err)
	}
	logs := &syncBuffer{}
	c, err := NewController(dyn, cfg, WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	jobsets := dyn.Resource(JobSetResource).Namespace(cfg.Namespace)

	// Queues: flavors of their own, so the tenant subtest's are not reused.
	qc := testQueueConfig()
	qc.Namespace, qc.CPUFlavor, qc.GPUFlavor = cfg.Namespace, "ctl-cpu", "ctl-gpu"
	tenants := map[string]pool.Tenant{"alpha": testTenant(), "beta": {Weight: 1}}
	type ref struct {
		res      schema.GroupVersionResource
		ns, name string
	}
	queueObjects := []ref{{ResourceFlavorResource, "", qc.CPUFlavor}, {ResourceFlavorResource, "", qc.GPUFlavor}}
	for _, tn := range []string{"alpha", "beta"} {
		queueObjects = append(queueObjects, ref{ClusterQueueResource, "", QueueName(tn)}, ref{LocalQueueResource, cfg.Namespace, QueueName(tn)})
	}
	versions := func(when string) map[ref]string {
		t.Helper()
		out := map[ref]string{}
		for _, r := range queueObjects {
			var res dynamic.ResourceInterface = dyn.Resource(r.res)
			if r.ns != "" {
				res = dyn.Resource(r.res).Namespace(r.ns)
			}
			got, err := res.Get(ctx, r.name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("%s: %s %s: %v", when, r.res.Resource, r.name, err)
			}
			out[r] = got.GetResourceVersion()
		}
		return out
	}
	if err := c.EnsureQueues(ctx, tenants, qc); err != nil {
		t.Fatalf("first EnsureQueues: %v", err)
	}
	first := versions("after the first EnsureQueues")
	// The server defaults spec fields the rendering leaves out, so the
	// second call's comparison differs and it updates; the server must
	// find that update a no-op and keep every resource version.
	if err := c.EnsureQueues(ctx, tenants, qc); err != nil {
		t.Fatalf("second EnsureQueues: %v", err)
	}
	if second := versions("after the second EnsureQueues"); !reflect.DeepEqual(first, second) {
		t.Errorf("the second EnsureQueues changed objects: resource versions %v, then %v", first, second)
	}
	// A real change reaches the server, and only the tenant's ClusterQueue.
	changed := maps.Clone(tenants)
	alpha := changed["alpha"]
	alpha.Weight = 4
	changed["alpha"] = alpha
	if err := c.EnsureQueues(ctx, changed, qc); err != nil {
		t.Fatalf("EnsureQueues with a new weight: %v", err)
	}
	third := versions("after changing alpha's weight")
	for r, v := range first {
		want := r.res == ClusterQueueResource && r.name == QueueName("alpha")
		if got := third[r] != v; got != want {
			t.Errorf("changing alpha's weight: %s %s changed=%v, want %v", r.res.Resource, r.name, got, want)
		}
	}

	// Start twice: one JobSet, untouched by the second call.
	job := cpuJob()
	job.Spec.Id, job.Spec.Tenant, job.Spec.Ranks = "ctl-train", "alpha", 2
	id, name := job.Spec.Id, JobSetName(job.Spec.Id, job.Attempt)
	if err := c.Start(ctx, job); err != nil {
		t.Fatalf("first Start: %v", err)
	}
	stored, err := jobsets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("JobSet after Start: %v", err)
	}
	if err := c.Start(ctx, job); err != nil {
		t.Fatalf("second Start: %v", err)
	}
	l, err := jobsets.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 || l.Items[0].GetName() != name || l.Items[0].GetResourceVersion() != stored.GetResourceVersion() {
		t.Fatalf("after two Starts: %d JobSets (want only %s at resource version %s): %v", len(l.Items), name, stored.GetResourceVersion(), l.Items)
	}

	// Another job's JobSet holding the name of this job's next attempt.
	next := proto.Clone(job).(*pb.PoolJob)
	next.Attempt = 2
	other := proto.Clone(job).(*pb.PoolJob)
	other.Spec.Id = "ctl-other"
	foreignJS, err := Render(other, cfg)
	if err != nil {
		t.Fatal(err)
	}
	foreignJS.Name = JobSetName(id, next.Attempt)
	fm, err := ToUnstructured(foreignJS)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := create(ctx, dyn, fm)
	if err != nil {
		t.Fatalf("create foreign JobSet: %v", err)
	}
	if err := c.Start(ctx, next); !errors.Is(err, ErrForeignObject) || !strings.Contains(err.Error(), foreign.GetName()) {
		t.Fatalf("Start over another job's JobSet: %v, want %v naming %s", err, ErrForeignObject, foreign.GetName())
	}

	// Watch reports the JobSet that was there before it began; Kueue has
	// not admitted it, so it is still suspended. The foreign one is
	// skipped with a log line.
	sink := newRecSink()
	stopWatch := startWatch(t, c, sink)
	st := sink.expectState(t, id, job.Attempt, pool.Queued, "waiting for admission from LocalQueue "+QueueName("alpha"))
	if st.Restarts != 0 {
		t.Errorf("queued JobSet: %d restarts, want 0", st.Restarts)
	}
	sink.expect(t, "synced", "", 0)
	if got := logs.String(); !strings.Contains(got, "ignoring JobSet") || !strings.Contains(got, foreign.GetName()) {
		t.Errorf("no log line for the foreign JobSet %s; logs:\n%s", foreign.GetName(), got)
	}

	// Admission, as Kueue does it: clear spec.suspend.
	u, err := jobsets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, false, "spec", "suspend"); err != nil {
		t.Fatal(err)
	}
	if _, err := jobsets.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("unsuspend JobSet: %v", err)
	}
	sink.expectState(t, id, job.Attempt, pool.Running, "running")

	// writeStatus replaces the JobSet's status through the status
	// subresource, as the JobSet controller does, and returns the new
	// resource version.
	writeStatus := func(what string, status jobset.JobSetStatus) string {
		t.Helper()
		u, err := jobsets.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
		if err != nil {
			t.Fatal(err)
		}
		u.Object["status"] = m
		got, err := jobsets.UpdateStatus(ctx, u, metav1.UpdateOptions{FieldValidation: "Strict"})
		if err != nil {
			t.Fatalf("%s: update status: %v", what, err)
		}
		if got.GetResourceVersion() == u.GetResourceVersion() {
			t.Fatalf("%s: the status write changed nothing (resource version %s)", what, got.GetResourceVersion())
		}
		return got.GetResourceVersion()
	}
	ranks := func(ready, active, succeeded int32) []jobset.ReplicatedJobStatus {
		return []jobset.ReplicatedJobStatus{{Name: replicatedJobName, Ready: ready, Active: active, Succeeded: succeeded}}
	}
	// A status change that leaves the mapped state as it was is not
	// reported: the next report must be the completion.
	writeStatus("ranks ready", jobset.JobSetStatus{ReplicatedJobsStatus: ranks(1, 1, 0)})
	done := condTrue(jobset.JobSetCompleted, "AllJobsCompleted")
	done.Message = "jobset completed successfully"
	writeStatus("completed", jobset.JobSetStatus{Conditions: []metav1.Condition{done}, Restarts: 1, RestartsCountTowardsMax: 1,
		TerminalState: string(jobset.JobSetCompleted), ReplicatedJobsStatus: ranks(0, 0, 1)})
	st = sink.expectState(t, id, job.Attempt, pool.Succeeded, "AllJobsCompleted: jobset completed successfully")
	if st.Restarts != 1 {
		t.Errorf("completed JobSet: %d restarts, want 1", st.Restarts)
	}

	// Stop deletes it, the watch says so, and a second Stop is a no-op.
	for i := range 2 {
		if err := c.Stop(ctx, id, job.Attempt); err != nil {
			t.Fatalf("Stop %d: %v", i+1, err)
		}
	}
	sink.expect(t, "gone", id, job.Attempt)
	if _, err := jobsets.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("JobSet after Stop: %v, want NotFound", err)
	}
	// Stop leaves the foreign JobSet alone.
	if err := c.Stop(ctx, id, next.Attempt); !errors.Is(err, ErrForeignObject) {
		t.Errorf("Stop of the attempt whose name another job holds: %v, want %v", err, ErrForeignObject)
	}
	if got, err := jobsets.Get(ctx, foreign.GetName(), metav1.GetOptions{}); err != nil || got.GetResourceVersion() != foreign.GetResourceVersion() {
		t.Errorf("foreign JobSet after Start and Stop refused: %v, resource version %s, want %s", err, got.GetResourceVersion(), foreign.GetResourceVersion())
	}

	// Once Watch has returned every report has been delivered: nothing
	// beyond those checked above.
	stopWatch()
	for {
		select {
		case e := <-sink.ch:
			t.Errorf("unexpected report after the JobSet was gone: %+v", e)
		default:
			return
		}
	}
}
