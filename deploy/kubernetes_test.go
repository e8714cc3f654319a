package deploy_test

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"golang.org/x/mod/modfile"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/fleetlearn/fleetlearn/internal/freeport"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server"
)

// The overlays under kubernetes/, each rendered as kubectl apply -k would.
var overlays = []string{"base", "external-nats", "pool-executor", "replicated"}

// aggregatorReplicas is how many fleetlearn-server pods each overlay runs:
// one on SQLite, several only on a shared PostgreSQL store (--store).
var aggregatorReplicas = map[string]int32{"base": 1, "external-nats": 1, "pool-executor": 1, "replicated": 2}

const (
	namespace     = "fleetlearn"
	clusterDomain = "cluster.local"
	// natsResolverDir is the --nats-resolver-dir of the documented one-time
	// step: where each NATS node keeps the account JWTs it is sent.
	natsResolverDir = "/data/jwt"
)

// documentedSecrets are the Secrets the overlays use but do not render
// (they hold the NATS operator's keys), with the keys the one-time step in
// deploy/README.md gives them: `create secret generic NAME --from-file=…`.
var documentedSecrets = map[string][]string{
	// --from-file=fleetlearn-auth.conf: what --write-nats-config wrote.
	"nats-fleetlearn-auth": {"fleetlearn-auth.conf"},
	// --from-file=fleetlearn-nats-auth/nats-auth/: one key per file there.
	"fleetlearn-nats-auth": {"account.nk", "operator.nk", "service-user.nk", "system-user.nk", "system.nk"},
	// --from-file=fleetlearn-replica/<each of replicaSecretFiles>: a key
	// per file, named by its base name.
	"fleetlearn-replica-secrets": {"admin.token", "api.key", "audit.keys", "ca.crt", "ca.key", "enroll.key"},
	// --from-literal=password=…
	"fleetlearn-postgres": {"password"},
}

// replicaSecretsDir is the directory the documented step
// (fleetlearn-server replica-secrets --data-dir DIR) writes the replicas'
// secrets to, and replicaSecretFiles the files below it that the step
// puts in Secret fleetlearn-replica-secrets; nats-auth/ goes to
// fleetlearn-nats-auth.
const replicaSecretsDir = "fleetlearn-replica"

var replicaSecretFiles = []string{"tls/ca.crt", "tls/ca.key", "keys/api.key", "keys/enroll.key", "admin.token", "audit.keys"}

// imageDockerfiles are the Dockerfiles of the images the manifests run, by
// image name: a container without a command runs the image's ENTRYPOINT.
var imageDockerfiles = map[string]string{
	"fleetlearn-server": "docker/Dockerfile.server",
	"fleetlearn-edge":   "docker/Dockerfile.edge",
	"fleetlearn-worker": "docker/Dockerfile.worker",
}

// fleetlearnBinaries are the programs bins builds.
var fleetlearnBinaries = []string{"fleetlearn", "fleetlearn-server", "fleetlearn-edge", "fleetlearn-worker"}

// manifests are one overlay's rendered resources, decoded into the
// Kubernetes API types.
type manifests struct {
	overlay             string
	namespaces          []*corev1.Namespace
	configMaps          map[string]*corev1.ConfigMap
	services            []*corev1.Service
	sets                []*appsv1.StatefulSet
	pdbs                []*policyv1.PodDisruptionBudget
	serviceAccounts     []*corev1.ServiceAccount
	claims              []*corev1.PersistentVolumeClaim
	volumes             []*corev1.PersistentVolume
	roles               []*rbacv1.Role
	roleBindings        []*rbacv1.RoleBinding
	clusterRoles        []*rbacv1.ClusterRole
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
}

// strictDecoder decodes the kinds the overlays may render and refuses
// unknown and duplicate fields, as the API server's strict field
// validation does.
var strictDecoder = func() k8sruntime.Decoder {
	s := k8sruntime.NewScheme()
	for _, add := range []func(*k8sruntime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
}()

func renderOverlay(t *testing.T, overlay string) *manifests {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join("kubernetes", overlay))
	if err != nil {
		t.Fatalf("kustomize %s: %v", overlay, err)
	}
	m := &manifests{overlay: overlay, configMaps: map[string]*corev1.ConfigMap{}}
	for _, r := range rm.Resources() {
		id := r.CurId().String()
		js, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %s: %v", overlay, id, err)
		}
		obj, _, err := strictDecoder.Decode(js, nil, nil)
		if err != nil {
			t.Errorf("%s: %s: %v", overlay, id, err)
			continue
		}
		switch o := obj.(type) {
		case *corev1.Namespace:
			m.namespaces = append(m.namespaces, o)
		case *corev1.ConfigMap:
			m.configMaps[o.Name] = o
		case *corev1.Service:
			m.services = append(m.services, o)
		case *appsv1.StatefulSet:
			m.sets = append(m.sets, o)
		case *policyv1.PodDisruptionBudget:
			m.pdbs = append(m.pdbs, o)
		case *corev1.ServiceAccount:
			m.serviceAccounts = append(m.serviceAccounts, o)
		case *corev1.PersistentVolumeClaim:
			m.claims = append(m.claims, o)
		case *corev1.PersistentVolume:
			m.volumes = append(m.volumes, o)
		case *rbacv1.Role:
			m.roles = append(m.roles, o)
		case *rbacv1.RoleBinding:
			m.roleBindings = append(m.roleBindings, o)
		case *rbacv1.ClusterRole:
			m.clusterRoles = append(m.clusterRoles, o)
		case *rbacv1.ClusterRoleBinding:
			m.clusterRoleBindings = append(m.clusterRoleBindings, o)
		case *corev1.Secret:
			t.Errorf("%s: renders Secret %s: the Secrets hold keys and are created by the documented one-time step", overlay, o.Name)
		default:
			t.Errorf("%s: %s: no check here knows this kind", overlay, id)
		}
	}
	if len(m.sets) == 0 {
		t.Fatalf("%s: renders no workload", overlay)
	}
	return m
}

// TestKubernetesStrictDecoder makes sure the decoder the manifests pass
// would refuse a misspelt field.
func TestKubernetesStrictDecoder(t *testing.T) {
	bad := `{"apiVersion":"v1","kind":"Service","metadata":{"name":"x"},"spec":{"ports":[{"port":1,"targetport":"a"}]}}`
	if _, _, err := strictDecoder.Decode([]byte(bad), nil, nil); err == nil || !k8sruntime.IsStrictDecodingError(err) {
		t.Fatalf("decoding a Service with the unknown field targetport: %v, want a strict decoding error", err)
	}
}

// TestKubernetesManifests renders every overlay and checks that what
// refers to something finds it: probes and Services reach ports that
// speak what they expect, mounts and key references find their volumes,
// ConfigMaps and documented Secrets, and the fleetlearn-server flags agree
// with the volumes, Services and DNS names of the overlay.
func TestKubernetesManifests(t *testing.T) {
	secretsUsed := map[string]bool{}
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			m := renderOverlay(t, overlay)
			checkNamespace(t, m)
			ls := map[*corev1.Container][]portListener{}
			for _, sts := range m.sets {
				checkWorkload(t, m, sts, secretsUsed)
				for i := range sts.Spec.Template.Spec.Containers {
					c := &sts.Spec.Template.Spec.Containers[i]
					if prog := containerProgramOf(t, m, sts, c); isFleetlearn(prog.argv[0]) {
						ls[c] = checkFleetlearnContainer(t, m, sts, c, prog)
					}
				}
			}
			checkServices(t, m, ls)
			checkPDBs(t, m)
			checkClaims(t, m)
			checkBindings(t, m)
			checkAggregatorReplicas(t, m)
		})
	}
	t.Run("secrets", func(t *testing.T) {
		for name := range documentedSecrets {
			if !secretsUsed[name] {
				t.Errorf("documented Secret %s is used by no overlay", name)
			}
		}
	})
	t.Run("README", func(t *testing.T) {
		b, err := os.ReadFile("README.md")
		if err != nil {
			t.Fatal(err)
		}
		readme := string(b)
		for name := range documentedSecrets {
			if want := "create secret generic " + name; !strings.Contains(readme, want) {
				t.Errorf("deploy/README.md does not say %q: the overlays need that Secret", want)
			}
		}
		if want := "--nats-resolver-dir " + natsResolverDir; !strings.Contains(readme, want) {
			t.Errorf("deploy/README.md does not say %q: the NATS nodes keep their resolver there", want)
		}
		for _, want := range []string{"replica-secrets --data-dir " + replicaSecretsDir, "--from-file=" + replicaSecretsDir + "/nats-auth/"} {
			if !strings.Contains(readme, want) {
				t.Errorf("deploy/README.md does not say %q: the replicated overlay's Secrets come from there", want)
			}
		}
		for _, f := range replicaSecretFiles {
			if want := "--from-file=" + replicaSecretsDir + "/" + f; !strings.Contains(readme, want) {
				t.Errorf("deploy/README.md does not say %q: Secret fleetlearn-replica-secrets needs that file", want)
			}
		}
	})
}

func checkNamespace(t *testing.T, m *manifests) {
	t.Helper()
	known := map[string]bool{}
	for _, n := range m.namespaces {
		known[n.Name] = true
		level := n.Labels["pod-security.kubernetes.io/enforce"]
		switch {
		case n.Name == namespace && level != "restricted":
			t.Errorf("%s: namespace %s enforces Pod Security %q, want restricted", m.overlay, n.Name, level)
		case n.Name != namespace && level != "restricted" && level != "baseline":
			// The ranks' namespace: their pods have no securityContext, so
			// restricted would refuse them; nothing here needs privileged.
			t.Errorf("%s: namespace %s enforces Pod Security %q, want restricted or baseline", m.overlay, n.Name, level)
		}
	}
	if !known[namespace] {
		t.Errorf("%s: renders no Namespace %s", m.overlay, namespace)
	}
	var objs []metav1.Object
	for _, o := range m.configMaps {
		objs = append(objs, o)
	}
	for _, o := range m.services {
		objs = append(objs, o)
	}
	for _, o := range m.sets {
		objs = append(objs, o)
	}
	for _, o := range m.pdbs {
		objs = append(objs, o)
	}
	for _, o := range objs {
		if o.GetNamespace() != namespace {
			t.Errorf("%s: %s is in namespace %q, want %s (the DNS names in the flags and nats.conf name it)",
				m.overlay, o.GetName(), o.GetNamespace(), namespace)
		}
	}
	// The rest may be in the ranks' namespace too, but in one rendered.
	var placed []metav1.Object
	for _, o := range m.serviceAccounts {
		placed = append(placed, o)
	}
	for _, o := range m.claims {
		placed = append(placed, o)
	}
	for _, o := range m.roles {
		placed = append(placed, o)
	}
	for _, o := range m.roleBindings {
		placed = append(placed, o)
	}
	for _, o := range placed {
		if !known[o.GetNamespace()] {
			t.Errorf("%s: %s is in namespace %q, which the overlay does not render", m.overlay, o.GetName(), o.GetNamespace())
		}
	}
}

// checkWorkload checks a StatefulSet's selector, service, hardening,
// volumes and references; secretsUsed collects the Secrets it uses.
func checkWorkload(t *testing.T, m *manifests, sts *appsv1.StatefulSet, secretsUsed map[string]bool) {
	t.Helper()
	where := m.overlay + ": statefulset " + sts.Name
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Errorf("%s: selector %v does not select its pod template's labels %v (%v)", where, sts.Spec.Selector, sts.Spec.Template.Labels, err)
	}
	if hs := m.service(sts.Spec.ServiceName); hs == nil || hs.Spec.ClusterIP != corev1.ClusterIPNone || !selects(hs, sts) {
		t.Errorf("%s: serviceName %q is not a headless Service selecting its pods", where, sts.Spec.ServiceName)
	}
	pod := &sts.Spec.Template.Spec
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the pod must run as non-root with the RuntimeDefault seccomp profile (Pod Security restricted)", where)
	}
	volumes := map[string]*corev1.Volume{}
	for i := range pod.Volumes {
		v := &pod.Volumes[i]
		if volumes[v.Name] != nil {
			t.Errorf("%s: volume %s twice", where, v.Name)
		}
		volumes[v.Name] = v
		switch {
		case v.ConfigMap != nil:
			m.checkConfigMapKeys(t, where+": volume "+v.Name, v.ConfigMap.Name, itemKeys(v.ConfigMap.Items), v.ConfigMap.Optional)
		case v.Secret != nil:
			secretsUsed[v.Secret.SecretName] = true
			checkSecretKeys(t, where+": volume "+v.Name, v.Secret.SecretName, itemKeys(v.Secret.Items))
			if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
				t.Errorf("%s: volume %s: the Secret's keys are readable by every user in the pod (defaultMode %v); 0440 with fsGroup is enough",
					where, v.Name, v.Secret.DefaultMode)
			}
		case v.EmptyDir != nil:
		case v.PersistentVolumeClaim != nil:
			if m.claim(sts.Namespace, v.PersistentVolumeClaim.ClaimName) == nil {
				t.Errorf("%s: volume %s: claim %s is not rendered in namespace %s, and a pod mounts only claims of its own namespace",
					where, v.Name, v.PersistentVolumeClaim.ClaimName, sts.Namespace)
			}
		default:
			t.Errorf("%s: volume %s: no check here knows its type", where, v.Name)
		}
	}
	if sa := pod.ServiceAccountName; sa != "" && sa != "default" && m.serviceAccount(sts.Namespace, sa) == nil {
		t.Errorf("%s: serviceAccountName %s is not rendered in namespace %s: the pod would never be created", where, sa, sts.Namespace)
	}
	claims := map[string]bool{}
	for _, pvc := range sts.Spec.VolumeClaimTemplates {
		if volumes[pvc.Name] != nil {
			t.Errorf("%s: volume %s is both a pod volume and a claim template", where, pvc.Name)
		}
		claims[pvc.Name] = true
	}
	for i := range pod.Containers {
		c := &pod.Containers[i]
		cw := where + ": container " + c.Name
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: want allowPrivilegeEscalation false, readOnlyRootFilesystem true and capabilities drop [ALL] only", cw)
		}
		mounts := map[string]bool{}
		for _, vm := range c.VolumeMounts {
			if volumes[vm.Name] == nil && !claims[vm.Name] {
				t.Errorf("%s: volumeMount %s names no volume or claim template", cw, vm.Name)
			}
			if mounts[vm.MountPath] {
				t.Errorf("%s: two volumes at %s", cw, vm.MountPath)
			}
			if v := volumes[vm.Name]; v != nil && v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ReadOnly && !vm.ReadOnly {
				t.Errorf("%s: volumeMount %s is writable, but its claim is mounted read-only", cw, vm.Name)
			}
			mounts[vm.MountPath] = true
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			switch r := e.ValueFrom; {
			case r.ConfigMapKeyRef != nil:
				m.checkConfigMapKeys(t, cw+": env "+e.Name, r.ConfigMapKeyRef.Name, []string{r.ConfigMapKeyRef.Key}, r.ConfigMapKeyRef.Optional)
			case r.SecretKeyRef != nil:
				secretsUsed[r.SecretKeyRef.Name] = true
				checkSecretKeys(t, cw+": env "+e.Name, r.SecretKeyRef.Name, []string{r.SecretKeyRef.Key})
			case r.FieldRef != nil:
				if _, ok := fieldValue(sts, r.FieldRef.FieldPath); !ok {
					t.Errorf("%s: env %s: no check here knows field %s", cw, e.Name, r.FieldRef.FieldPath)
				}
			default:
				t.Errorf("%s: env %s: no check here knows its source", cw, e.Name)
			}
		}
		for _, ef := range c.EnvFrom {
			switch {
			case ef.ConfigMapRef != nil:
				m.checkConfigMapKeys(t, cw+": envFrom", ef.ConfigMapRef.Name, nil, ef.ConfigMapRef.Optional)
			case ef.SecretRef != nil:
				secretsUsed[ef.SecretRef.Name] = true
				checkSecretKeys(t, cw+": envFrom", ef.SecretRef.Name, nil)
			}
		}
		ports := map[string]bool{}
		for _, p := range c.Ports {
			if p.Name != "" && ports[p.Name] {
				t.Errorf("%s: port name %s twice", cw, p.Name)
			}
			ports[p.Name] = true
		}
		for _, pr := range podProbes(c) {
			if _, err := containerPortOf(c, pr.port()); pr.port() != nil && err != nil {
				t.Errorf("%s: %s: %v", cw, pr.name, err)
			}
			if pr.GRPC != nil {
				t.Errorf("%s: %s: a gRPC probe: the kubelet's speaks plaintext gRPC, and no port here does", cw, pr.name)
			}
			if pr.Exec != nil && (len(pr.Exec.Command) == 0 || !knownProgram(pr.Exec.Command[0])) {
				t.Errorf("%s: %s: exec %q runs no program this image has", cw, pr.name, pr.Exec.Command)
			}
		}
	}
}

func (m *manifests) service(name string) *corev1.Service {
	for _, s := range m.services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func (m *manifests) set(name string) *appsv1.StatefulSet {
	for _, s := range m.sets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// selects reports whether svc routes to sts's pods.
func selects(svc *corev1.Service, sts *appsv1.StatefulSet) bool {
	return len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(sts.Spec.Template.Labels))
}

func itemKeys(items []corev1.KeyToPath) []string {
	var keys []string
	for _, it := range items {
		keys = append(keys, it.Key)
	}
	return keys
}

// checkConfigMapKeys checks that the overlay renders ConfigMap name with
// every one of keys.
func (m *manifests) checkConfigMapKeys(t *testing.T, where, name string, keys []string, optional *bool) {
	t.Helper()
	if optional != nil && *optional {
		t.Errorf("%s: ConfigMap %s is optional: the server would start without what it says", where, name)
	}
	cm := m.configMaps[name]
	if cm == nil {
		t.Errorf("%s: ConfigMap %s is not rendered by the overlay", where, name)
		return
	}
	for _, k := range keys {
		if _, ok := cm.Data[k]; !ok {
			t.Errorf("%s: ConfigMap %s has no key %s", where, name, k)
		}
	}
}

// checkSecretKeys checks that the documented step creates Secret name
// with every one of keys.
func checkSecretKeys(t *testing.T, where, name string, keys []string) {
	t.Helper()
	have, ok := documentedSecrets[name]
	if !ok {
		t.Errorf("%s: Secret %s is neither rendered nor created by the documented step", where, name)
		return
	}
	for _, k := range keys {
		if !slices.Contains(have, k) {
			t.Errorf("%s: Secret %s as documented has no key %s (it has %v)", where, name, k, have)
		}
	}
}

// fieldValue is what a fieldRef reads in the first pod of sts.
func fieldValue(sts *appsv1.StatefulSet, field string) (string, bool) {
	switch field {
	case "metadata.name":
		return sts.Name + "-0", true
	case "metadata.namespace":
		return namespace, true
	}
	return "", false
}

// probe is one of a container's probes or lifecycle hooks, by its name.
type podProbe struct {
	name string
	corev1.ProbeHandler
}

func (p podProbe) port() *intstr.IntOrString {
	switch {
	case p.HTTPGet != nil:
		return &p.HTTPGet.Port
	case p.TCPSocket != nil:
		return &p.TCPSocket.Port
	case p.GRPC != nil:
		port := intstr.FromInt32(p.GRPC.Port)
		return &port
	}
	return nil
}

func podProbes(c *corev1.Container) []podProbe {
	var ps []podProbe
	for _, p := range []struct {
		name string
		p    *corev1.Probe
	}{{"startupProbe", c.StartupProbe}, {"readinessProbe", c.ReadinessProbe}, {"livenessProbe", c.LivenessProbe}} {
		if p.p != nil {
			ps = append(ps, podProbe{p.name, p.p.ProbeHandler})
		}
	}
	if l := c.Lifecycle; l != nil {
		for _, h := range []struct {
			name string
			h    *corev1.LifecycleHandler
		}{{"postStart", l.PostStart}, {"preStop", l.PreStop}} {
			if h.h != nil {
				ps = append(ps, podProbe{h.name, corev1.ProbeHandler{Exec: h.h.Exec, HTTPGet: h.h.HTTPGet, TCPSocket: h.h.TCPSocket}})
			}
		}
	}
	return ps
}

// containerPortOf resolves a probe's or Service's port (a name or a
// number) to a port the container declares.
func containerPortOf(c *corev1.Container, p *intstr.IntOrString) (int32, error) {
	if p == nil {
		return 0, errors.New("no port")
	}
	for _, cp := range c.Ports {
		if p.Type == intstr.String && cp.Name == p.StrVal || p.Type == intstr.Int && cp.ContainerPort == p.IntVal {
			if cp.Protocol != "" && cp.Protocol != corev1.ProtocolTCP {
				return 0, fmt.Errorf("port %s is %s, not TCP", p, cp.Protocol)
			}
			return cp.ContainerPort, nil
		}
	}
	return 0, fmt.Errorf("port %s is not a port of container %s", p.String(), c.Name)
}

func knownProgram(argv0 string) bool {
	return isFleetlearn(argv0) || slices.Contains([]string{"nats-server", "pg_isready", "pg_ctl"}, path.Base(argv0))
}

func isFleetlearn(argv0 string) bool { return slices.Contains(fleetlearnBinaries, path.Base(argv0)) }

// listener is what a process serves on a port.
type portListener struct {
	host   string
	port   int32
	speaks string   // "tls" (gRPC inside), "grpc" (plaintext), "http", "nats", "nats-route"
	paths  []string // with "http": the paths served; one ending in "*" is a prefix
	flag   string   // what opened it
}

func (l portListener) everyInterface() bool {
	ip := net.ParseIP(strings.Trim(l.host, "[]"))
	return l.host == "" || ip != nil && ip.IsUnspecified()
}

func listenerAt(ls []portListener, port int32) (portListener, bool) {
	for _, l := range ls {
		if l.port == port {
			return l, true
		}
	}
	return portListener{}, false
}

// checkListeners checks a container's probes and declared ports against
// what its process serves: each port is served on every interface (the
// kubelet and Services dial the pod's address), each listener on every
// interface is declared, and each probe asks in the language its port
// speaks.
func checkListeners(t *testing.T, where string, c *corev1.Container, ls []portListener) {
	t.Helper()
	for _, cp := range c.Ports {
		l, ok := listenerAt(ls, cp.ContainerPort)
		switch {
		case !ok:
			t.Errorf("%s: port %s (%d): nothing listens there", where, cp.Name, cp.ContainerPort)
		case !l.everyInterface():
			t.Errorf("%s: port %s: %s listens on %s only, which the pod's address does not reach", where, cp.Name, l.flag, l.host)
		}
	}
	for _, l := range ls {
		if _, err := containerPortOf(c, ptrTo(intstr.FromInt32(l.port))); l.everyInterface() && err != nil {
			t.Errorf("%s: %s listens on %d, which the container does not declare", where, l.flag, l.port)
		}
	}
	for _, pr := range podProbes(c) {
		p := pr.port()
		if p == nil {
			continue
		}
		n, err := containerPortOf(c, p)
		if err != nil {
			continue // checkWorkload said so
		}
		l, ok := listenerAt(ls, n)
		if !ok {
			t.Errorf("%s: %s: nothing listens on %d", where, pr.name, n)
			continue
		}
		switch {
		case pr.HTTPGet != nil:
			h := pr.HTTPGet
			if l.speaks != "http" {
				t.Errorf("%s: %s: httpGet on %d, which speaks %s (%s), not plain HTTP", where, pr.name, n, l.speaks, l.flag)
			} else if h.Scheme != "" && h.Scheme != corev1.URISchemeHTTP {
				t.Errorf("%s: %s: scheme %s on %d, which speaks plain HTTP", where, pr.name, h.Scheme, n)
			} else if p, _, _ := strings.Cut(h.Path, "?"); !servesPath(l.paths, p) {
				t.Errorf("%s: %s: %s serves %v, not %s", where, pr.name, l.flag, l.paths, h.Path)
			}
			if h.Host != "" {
				t.Errorf("%s: %s: httpGet host %s: the kubelet would not ask this pod", where, pr.name, h.Host)
			}
		case pr.GRPC != nil && l.speaks != "grpc":
			t.Errorf("%s: %s: the kubelet's gRPC probe speaks plaintext; %d speaks %s (%s)", where, pr.name, n, l.speaks, l.flag)
		}
	}
}

func servesPath(paths []string, p string) bool {
	for _, s := range paths {
		if s == p || strings.HasSuffix(s, "*") && strings.HasPrefix(p, strings.TrimSuffix(s, "*")) {
			return true
		}
	}
	return false
}

func ptrTo[T any](v T) *T { return &v }

// checkServices checks that every Service selects exactly one workload and
// that each of its ports reaches a declared container port; where the
// listeners of that container are known, one served on every interface.
func checkServices(t *testing.T, m *manifests, listeners map[*corev1.Container][]portListener) {
	t.Helper()
	for _, svc := range m.services {
		where := m.overlay + ": service " + svc.Name
		var sts *appsv1.StatefulSet
		for _, s := range m.sets {
			if selects(svc, s) {
				if sts != nil {
					t.Errorf("%s: selects the pods of %s and %s", where, sts.Name, s.Name)
				}
				sts = s
			}
		}
		if sts == nil {
			t.Errorf("%s: selector %v selects no pods of the overlay", where, svc.Spec.Selector)
			continue
		}
		for _, sp := range svc.Spec.Ports {
			target := sp.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(sp.Port)
			}
			c, n := targetContainer(sts, &target)
			if c == nil {
				t.Errorf("%s: port %s (%d): targetPort %s is no container port of %s", where, sp.Name, sp.Port, target.String(), sts.Name)
				continue
			}
			if ls, ok := listeners[c]; ok {
				if l, ok := listenerAt(ls, n); !ok || !l.everyInterface() {
					t.Errorf("%s: port %s: container %s serves nothing on %d on every interface", where, sp.Name, c.Name, n)
				}
			}
		}
	}
}

// targetContainer is the container of sts's pods that declares port p, and
// the port's number.
func targetContainer(sts *appsv1.StatefulSet, p *intstr.IntOrString) (*corev1.Container, int32) {
	for i := range sts.Spec.Template.Spec.Containers {
		c := &sts.Spec.Template.Spec.Containers[i]
		if n, err := containerPortOf(c, p); err == nil {
			return c, n
		}
	}
	return nil, 0
}

func checkPDBs(t *testing.T, m *manifests) {
	t.Helper()
	for _, pdb := range m.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		n := 0
		for _, sts := range m.sets {
			if err == nil && !sel.Empty() && sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: poddisruptionbudget %s selects the pods of %d workloads, want 1 (%v)", m.overlay, pdb.Name, n, err)
		}
	}
}

// program is a container's command line as the kubelet runs it: $(VAR)
// references replaced from its environment.
type containerProgram struct {
	argv []string
	env  map[string]string
}

// programOf is c's command line, with the image's ENTRYPOINT and CMD
// where the container gives no command, as Kubernetes combines them.
func containerProgramOf(t *testing.T, m *manifests, sts *appsv1.StatefulSet, c *corev1.Container) containerProgram {
	t.Helper()
	where := m.overlay + ": " + sts.Name + "/" + c.Name
	argv := slices.Concat(c.Command, c.Args)
	if len(c.Command) == 0 {
		name, _, _ := strings.Cut(path.Base(c.Image), ":")
		df, ok := imageDockerfiles[name]
		if !ok {
			t.Fatalf("%s: image %s: give the command; the image's entrypoint is unknown here", where, c.Image)
		}
		img := parseDockerfile(t, df)
		argv = img.entrypoint
		if len(c.Args) == 0 {
			argv = slices.Concat(argv, img.cmd)
		} else {
			argv = slices.Concat(argv, c.Args)
		}
	}
	if len(argv) == 0 {
		t.Fatalf("%s: runs nothing", where)
	}
	env := containerEnv(t, m, sts, c)
	for i, a := range argv {
		s, missing := expandVars(a, env)
		if len(missing) > 0 {
			t.Errorf("%s: argument %q: $(%s) is not in the container's environment, so the process gets it literally",
				where, a, strings.Join(missing, "), $("))
		}
		argv[i] = s
	}
	return containerProgram{argv: argv, env: env}
}

// containerEnv is c's environment in sts's first pod, with ConfigMap values
// from the overlay; values from Secrets are left out.
func containerEnv(t *testing.T, m *manifests, sts *appsv1.StatefulSet, c *corev1.Container) map[string]string {
	t.Helper()
	return podEnv(t, m, sts, c, sts.Name+"-0")
}

// podEnv is c's environment in sts's pod named pod.
func podEnv(t *testing.T, m *manifests, sts *appsv1.StatefulSet, c *corev1.Container, pod string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch r := e.ValueFrom; {
		case r == nil:
			// A value may refer to the variables before it.
			env[e.Name], _ = expandVars(e.Value, env)
		case r.ConfigMapKeyRef != nil:
			if cm := m.configMaps[r.ConfigMapKeyRef.Name]; cm != nil {
				if v, ok := cm.Data[r.ConfigMapKeyRef.Key]; ok {
					env[e.Name] = v
				}
			}
		case r.FieldRef != nil:
			if v, ok := fieldValue(sts, r.FieldRef.FieldPath); ok {
				env[e.Name] = v
			}
			if r.FieldRef.FieldPath == "metadata.name" {
				env[e.Name] = pod
			}
		}
	}
	return env
}

// expand replaces $(NAME) in s as the kubelet does: from env, "$$" for a
// literal "$", and an unknown name left as it is (and returned).
func expandVars(s string, env map[string]string) (string, []string) {
	var b strings.Builder
	var missing []string
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String(), missing
			}
			name := s[i+2 : i+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
				missing = append(missing, name)
			}
			i += end
		default:
			b.WriteByte('$')
		}
	}
	return b.String(), missing
}

// flagValues are the values of a command line's flags, the last one of
// each winning as in pflag; a flag without "=" is a boolean. The manifests
// write every flag as --name=value, so that this reads them without
// knowing the flag set; the binary itself checks the names (TestKubernetesArgs).
type flagArgs map[string]string

func parseFlagArgs(args []string) (flagArgs, error) {
	f := flagArgs{}
	for _, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			return nil, fmt.Errorf("argument %q: want --name=value", a)
		}
		name, v, ok := strings.Cut(name, "=")
		if !ok {
			v = "true"
		}
		f[name] = v
	}
	return f, nil
}

func (f flagArgs) get(name, def string) (string, bool) {
	if v, ok := f[name]; ok {
		return v, true
	}
	return def, false
}

// serverListeners are what fleetlearn-server serves with flags f, with the
// binary's defaults (cmd/fleetlearn-server: loopback unless --public-host).
func serverListeners(f flagArgs) []portListener {
	public := f["public-host"] != ""
	var ls []portListener
	addr, given := f.get("grpc-addr", "127.0.0.1:7070")
	if public && !given {
		addr = ":7070"
	}
	speaks := "tls"
	if f["grpc-insecure"] == "true" {
		speaks = "grpc"
	}
	ls = appendListener(ls, addr, speaks, "--grpc-addr", nil)
	if f["nats-url"] == "" {
		addr, given := f.get("nats-listen", "127.0.0.1:4222")
		if public && !given {
			addr = "0.0.0.0:4222"
		}
		ls = appendListener(ls, addr, "nats", "--nats-listen", nil)
	}
	if addr, _ := f.get("metrics-addr", "127.0.0.1:9464"); addr != "off" {
		ls = appendListener(ls, addr, "http", "--metrics-addr", []string{"/metrics", "/healthz", "/readyz"})
	}
	return ls
}

// edgeListeners are what fleetlearn-edge serves with flags f.
func edgeListeners(f flagArgs) []portListener {
	if addr := f["health-addr"]; addr != "" && addr != "off" {
		return appendListener(nil, addr, "http", "--health-addr", []string{"/healthz", "/readyz"})
	}
	return nil
}

func appendListener(ls []portListener, addr, speaks, flag string, paths []string) []portListener {
	h, p, err := net.SplitHostPort(addr)
	n, perr := strconv.ParseUint(p, 10, 16)
	if err != nil || perr != nil {
		// Still a listener, on no port a manifest can name: the checks
		// that look for it say so.
		return append(ls, portListener{host: addr, port: -1, speaks: speaks, flag: flag + "=" + addr})
	}
	return append(ls, portListener{host: h, port: int32(n), speaks: speaks, paths: paths, flag: flag + "=" + addr})
}

// checkFleetlearnContainer checks a fleetlearn-server container's flags
// against the overlay: its data directory on the claim, the CLI's
// environment, the NATS keys on their Secret, and URLs and certificate
// names that reach Services of the overlay.
func checkFleetlearnContainer(t *testing.T, m *manifests, sts *appsv1.StatefulSet, c *corev1.Container, prog containerProgram) []portListener {
	t.Helper()
	where := m.overlay + ": " + sts.Name + "/" + c.Name
	if path.Base(prog.argv[0]) != "fleetlearn-server" {
		t.Errorf("%s: runs %s: no check here knows it in Kubernetes", where, prog.argv[0])
		return nil
	}
	f, err := parseFlagArgs(prog.argv[1:])
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return nil
	}
	ls := serverListeners(f)
	checkListeners(t, where, c, ls)

	dataDir, _ := f.get("data-dir", "fleetlearn-data")
	if vm, kind := mountHolding(sts, c, dataDir); kind != "claim" || vm.MountPath != dataDir || vm.ReadOnly {
		t.Errorf("%s: --data-dir=%s is not a writable volume from a claim template (%s)", where, dataDir, kind)
	}
	for name, want := range map[string]string{
		"FLEETLEARN_CA":         path.Join(dataDir, "tls", "ca.crt"),
		"FLEETLEARN_TOKEN_FILE": path.Join(dataDir, "admin.token"),
	} {
		if got := prog.env[name]; got != want {
			t.Errorf("%s: $%s is %q, want %q, for the fleetlearn CLI in the pod", where, name, got, want)
		}
	}
	if from, ok := f["nats-auth-from"]; ok {
		vm, kind := mountHolding(sts, c, from)
		if kind != "secret fleetlearn-nats-auth" || vm.MountPath != from || !vm.ReadOnly {
			t.Errorf("%s: --nats-auth-from=%s is not the read-only mount of Secret fleetlearn-nats-auth (%s)", where, from, kind)
		}
	}
	if from, ok := f["secrets-from"]; ok {
		vm, kind := mountHolding(sts, c, from)
		if kind != "secret fleetlearn-replica-secrets" || vm.MountPath != from || !vm.ReadOnly {
			t.Errorf("%s: --secrets-from=%s is not the read-only mount of Secret fleetlearn-replica-secrets (%s)", where, from, kind)
		}
	}
	if f["store"] != "" {
		checkReplicated(t, m, sts, c, f)
	} else if n := replicasOf(sts); n > 1 {
		t.Errorf("%s: %d replicas without --store: each would run the rounds on an SQLite file of its own", where, n)
	}
	checkPoolExecutor(t, m, sts, c, f)

	natsURL, external := f["nats-url"]
	if external {
		checkURLs(t, m, where+": --nats-url", natsURL, 4222)
	}
	if adv, ok := f["nats-advertise"]; ok {
		checkURLs(t, m, where+": --nats-advertise", adv, 4222)
	}
	if h := f["public-host"]; h == "" {
		t.Errorf("%s: no --public-host: the API and NATS would listen on loopback only", where)
	} else if svc, pod, err := m.resolve(h); err == nil {
		// The default names this cluster: check the server answers there.
		need := []int32{7070}
		if !external && f["nats-advertise"] == "" {
			need = append(need, 4222) // enrollment gives devices nats://HOST:4222
		}
		for _, p := range need {
			if pod == "" && !servicePort(svc, p) {
				t.Errorf("%s: --public-host=%s: service %s has no port %d", where, h, svc.Name, p)
			}
		}
		if !selects(svc, sts) {
			t.Errorf("%s: --public-host=%s reaches service %s, which does not select this pod", where, h, svc.Name)
		}
	}
	var hosts []string
	if f["tls-hosts"] != "" {
		hosts = strings.Split(f["tls-hosts"], ",")
	}
	for _, h := range hosts {
		svc, pod, err := m.resolve(h)
		switch {
		case err != nil:
			t.Errorf("%s: --tls-hosts: %v", where, err)
		case !selects(svc, sts):
			t.Errorf("%s: --tls-hosts: %s reaches service %s, which does not select this pod", where, h, svc.Name)
		case pod != "" && !strings.HasPrefix(pod, sts.Name+"-"):
			t.Errorf("%s: --tls-hosts: %s is pod %s, not one of %s", where, h, pod, sts.Name)
		}
	}
	// Each Service in front of the API must be in the certificate, under
	// its full name at least.
	for _, svc := range m.services {
		if selects(svc, sts) && servicePort(svc, 7070) && svc.Spec.ClusterIP != corev1.ClusterIPNone {
			full := svc.Name + "." + namespace + ".svc." + clusterDomain
			if !slices.Contains(hosts, full) {
				t.Errorf("%s: --tls-hosts lacks %s: clients of service %s would not verify the certificate", where, full, svc.Name)
			}
		}
	}
	return ls
}

// replicasOf is the StatefulSet's pod count (1 when unset).
func replicasOf(sts *appsv1.StatefulSet) int32 {
	if sts.Spec.Replicas == nil {
		return 1
	}
	return *sts.Spec.Replicas
}

// checkAggregatorReplicas checks that the overlay runs as many aggregator
// pods as aggregatorReplicas says.
func checkAggregatorReplicas(t *testing.T, m *manifests) {
	t.Helper()
	want, ok := aggregatorReplicas[m.overlay]
	if !ok {
		t.Errorf("%s: aggregatorReplicas does not say how many aggregators the overlay runs", m.overlay)
		return
	}
	sts := m.set("fleetlearn-server")
	if sts == nil {
		t.Errorf("%s: renders no fleetlearn-server StatefulSet", m.overlay)
		return
	}
	if got := replicasOf(sts); got != want {
		t.Errorf("%s: fleetlearn-server runs %d replicas, want %d", m.overlay, got, want)
	}
}

// checkReplicated checks an aggregator on a shared PostgreSQL store
// (--store): the URL reaches the overlay's PostgreSQL without holding the
// password, which comes from a Secret in $PGPASSWORD and is the one that
// PostgreSQL gives its user; the shared secrets come from their Secret;
// each pod names itself in the lease; only the leader is ready, so only it
// gets traffic, and a standby, never ready, is neither killed for it nor
// in the way of the StatefulSet's rollouts and the disruption budget.
func checkReplicated(t *testing.T, m *manifests, sts *appsv1.StatefulSet, c *corev1.Container, f flagArgs) {
	t.Helper()
	where := m.overlay + ": " + sts.Name + "/" + c.Name
	if f["nats-url"] == "" {
		t.Errorf("%s: --store without --nats-url: the replicas share an external NATS cluster, and the server refuses to start without one", where)
	}
	if f["secrets-from"] == "" {
		t.Errorf("%s: --store without --secrets-from: each replica would make a CA and token keys of its own", where)
	}
	var pgPassword *corev1.SecretKeySelector
	for _, e := range c.Env {
		if e.Name == "PGPASSWORD" && e.ValueFrom != nil {
			pgPassword = e.ValueFrom.SecretKeyRef
		}
	}
	if pgPassword == nil {
		t.Errorf("%s: $PGPASSWORD is not set from a Secret: the server could not log in to PostgreSQL", where)
	}
	u, err := url.Parse(f["store"])
	switch {
	case err != nil || u.Scheme != "postgres" && u.Scheme != "postgresql" || u.Hostname() == "":
		t.Errorf("%s: --store=%s is not a PostgreSQL URL (%v)", where, f["store"], err)
	case u.User == nil || u.User.Username() == "":
		t.Errorf("%s: --store=%s names no user", where, f["store"])
	default:
		if _, set := u.User.Password(); set {
			t.Errorf("%s: --store holds the password: it would be in the pod's spec and command line; give it in $PGPASSWORD from a Secret", where)
		}
		checkPostgres(t, m, where+": --store", u, pgPassword)
	}

	argv := slices.Concat(c.Command, c.Args)
	for i := range replicasOf(sts) {
		pod := fmt.Sprintf("%s-%d", sts.Name, i)
		env := podEnv(t, m, sts, c, pod)
		name := ""
		for _, a := range argv {
			if v, ok := strings.CutPrefix(a, "--replica-name="); ok {
				name, _ = expandVars(v, env)
			}
		}
		if name != pod {
			t.Errorf("%s: pod %s names itself %q in the lease, want its own name (from the downward API's metadata.name)", where, pod, name)
		}
	}

	if rp := c.ReadinessProbe; rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz" {
		t.Errorf("%s: the readiness probe must ask /readyz: only the leader is ready, so the Services send the API's traffic to it alone", where)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
	}{{"startupProbe", c.StartupProbe}, {"livenessProbe", c.LivenessProbe}} {
		if p.probe != nil && p.probe.HTTPGet != nil && strings.HasPrefix(p.probe.HTTPGet.Path, "/readyz") {
			t.Errorf("%s: %s asks /readyz: a standby is never ready, and the kubelet would kill it", where, p.name)
		}
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("%s: podManagementPolicy %q: OrderedReady creates and replaces a pod only once those before it are ready, and a standby never is",
			where, sts.Spec.PodManagementPolicy)
	}
	if sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Errorf("%s: updateStrategy %q: a rolling update waits for each new pod to be ready, and a standby never is; want OnDelete",
			where, sts.Spec.UpdateStrategy.Type)
	}
	for _, svc := range m.services {
		if selects(svc, sts) && svc.Spec.PublishNotReadyAddresses {
			t.Errorf("%s: service %s publishes pods that are not ready: it would send traffic to the standby, which does not serve it", where, svc.Name)
		}
	}
	var pdb *policyv1.PodDisruptionBudget
	for _, p := range m.pdbs {
		if sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector); err == nil && !sel.Empty() && sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
			pdb = p
		}
	}
	switch {
	case pdb == nil:
		t.Errorf("%s: no PodDisruptionBudget: a drain could evict the leader and the standby together", where)
	case pdb.Spec.MaxUnavailable != nil || pdb.Spec.MinAvailable == nil || *pdb.Spec.MinAvailable != intstr.FromInt32(1):
		t.Errorf("%s: poddisruptionbudget %s: want minAvailable 1, the leader, which is the one ready pod", where, pdb.Name)
	case pdb.Spec.UnhealthyPodEvictionPolicy != nil && *pdb.Spec.UnhealthyPodEvictionPolicy != policyv1.IfHealthyBudget:
		t.Errorf("%s: poddisruptionbudget %s: unhealthyPodEvictionPolicy %s would let a drain evict the replica taking over while none is ready",
			where, pdb.Name, *pdb.Spec.UnhealthyPodEvictionPolicy)
	}
}

// checkPostgres checks that a --store URL reaches a PostgreSQL container
// of the overlay that creates the URL's user and database, with the
// password of the Secret key the aggregator sends, and keeps its data on
// its claim.
func checkPostgres(t *testing.T, m *manifests, where string, u *url.URL, password *corev1.SecretKeySelector) {
	t.Helper()
	svc, _, err := m.resolve(u.Hostname())
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	port := int32(5432)
	if p := u.Port(); p != "" {
		n, _ := strconv.Atoi(p)
		port = int32(n)
	}
	var pgSet *appsv1.StatefulSet
	var pg *corev1.Container
	for _, sp := range svc.Spec.Ports {
		if sp.Port != port {
			continue
		}
		for _, sts := range m.sets {
			if selects(svc, sts) {
				if c, _ := targetContainer(sts, &sp.TargetPort); c != nil {
					pgSet, pg = sts, c
				}
			}
		}
	}
	if pg == nil {
		t.Errorf("%s: %s:%d reaches no container port of the overlay", where, u.Hostname(), port)
		return
	}
	env := podEnv(t, m, pgSet, pg, pgSet.Name+"-0")
	db := cmp.Or(strings.TrimPrefix(u.Path, "/"), u.User.Username())
	if got := env["POSTGRES_USER"]; got != u.User.Username() {
		t.Errorf("%s: connects as %q; %s/%s creates the user %q", where, u.User.Username(), pgSet.Name, pg.Name, got)
	}
	if got := env["POSTGRES_DB"]; got != db {
		t.Errorf("%s: opens database %q; %s/%s creates %q", where, db, pgSet.Name, pg.Name, got)
	}
	var have *corev1.SecretKeySelector
	for _, e := range pg.Env {
		if e.Name == "POSTGRES_PASSWORD" && e.ValueFrom != nil {
			have = e.ValueFrom.SecretKeyRef
		}
	}
	if have == nil || password == nil || have.Name != password.Name || have.Key != password.Key {
		t.Errorf("%s: $PGPASSWORD comes from %v, %s/%s's $POSTGRES_PASSWORD from %v: want the same Secret key", where, password, pgSet.Name, pg.Name, have)
	}
	if dataDir := env["PGDATA"]; dataDir == "" {
		t.Errorf("%s/%s: no $PGDATA", pgSet.Name, pg.Name)
	} else if vm, kind := mountHolding(pgSet, pg, dataDir); kind != "claim" || vm.ReadOnly || vm.MountPath == dataDir {
		// Below the mount point, which may hold lost+found, as initdb
		// wants an empty directory.
		t.Errorf("%s/%s: $PGDATA %s is not a directory below a writable claim template's mount (%s at %s)", pgSet.Name, pg.Name, dataDir, kind, vm.MountPath)
	}
}

// apiAccess is a resource the pool executor calls and the verbs it uses.
type apiAccess struct {
	group, resource string
	namespaced      bool // in the pool namespace; otherwise cluster-scoped
	verbs           []string
	queues          bool // only with --pool-kube-capacity (Controller.EnsureQueues)
	perJob          bool // called when a job starts, not at the server's start
}

// poolExecutorAccess is every call server/internal/kube's Controller
// makes: Start creates an attempt's JobSet and reads it back when the
// create collides, Stop reads and deletes it, Watch lists and watches the
// namespace's JobSets; EnsureQueues reads, creates and updates the
// flavors and the tenants' queues; Start reads and creates the
// WorkloadPriorityClass of a job's non-zero priority (and would update it,
// through the same ensure, were its labels to differ).
// TestKubernetesPoolExecutorCalls keeps it in step with the controller's
// source.
var poolExecutorAccess = []apiAccess{
	{group: "jobset.x-k8s.io", resource: "jobsets", namespaced: true, verbs: []string{"create", "delete", "get", "list", "watch"}},
	{group: "kueue.x-k8s.io", resource: "localqueues", namespaced: true, verbs: []string{"create", "get", "update"}, queues: true},
	{group: "kueue.x-k8s.io", resource: "resourceflavors", verbs: []string{"create", "get", "update"}, queues: true},
	{group: "kueue.x-k8s.io", resource: "clusterqueues", verbs: []string{"create", "get", "update"}, queues: true},
	{group: "kueue.x-k8s.io", resource: "workloadpriorityclasses", verbs: []string{"create", "get", "update"}, perJob: true},
}

// defaultPoolNamespace is fleetlearn-server's --pool-kube-namespace default.
const defaultPoolNamespace = "fleetlearn-pool"

// grant is one verb on one resource, in a namespace or ("") cluster-wide.
type grant struct{ namespace, group, resource, verb string }

func (g grant) String() string {
	where := "cluster-wide"
	if g.namespace != "" {
		where = "in " + g.namespace
	}
	return fmt.Sprintf("%s %s.%s %s", g.verb, g.resource, g.group, where)
}

// requiredGrants are what the executor configured by f calls; none without
// --pool-kubernetes.
func requiredGrants(f flagArgs) map[grant]bool {
	want := map[grant]bool{}
	if f["pool-kubernetes"] == "" {
		return want
	}
	ns, _ := f.get("pool-kube-namespace", defaultPoolNamespace)
	for _, a := range poolExecutorAccess {
		if a.queues && f["pool-kube-capacity"] == "" {
			continue
		}
		scope := ""
		if a.namespaced {
			scope = ns
		}
		for _, v := range a.verbs {
			want[grant{scope, a.group, a.resource, v}] = true
		}
	}
	return want
}

// grantsOf are what the overlay's bindings give service account ns/name,
// expanded to single verbs on single resources. Wildcards, resource names,
// aggregation and bindings to roles the overlay does not render cannot be
// expanded and are reported instead.
func (m *manifests) grantsOf(t *testing.T, ns, name string) map[grant]bool {
	t.Helper()
	got := map[grant]bool{}
	binds := func(subjects []rbacv1.Subject, bindingNS string) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			sns := s.Namespace
			if sns == "" {
				sns = bindingNS
			}
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == name && sns == ns
		})
	}
	add := func(where, scope string, rules []rbacv1.PolicyRule) {
		for _, r := range rules {
			if len(r.NonResourceURLs) > 0 || len(r.ResourceNames) > 0 ||
				slices.Contains(r.APIGroups, "*") || slices.Contains(r.Resources, "*") || slices.Contains(r.Verbs, "*") {
				t.Errorf("%s: %s: rule %v: grant named verbs on named resources, no wildcards, resource names or URLs", m.overlay, where, r)
				continue
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						got[grant{scope, g, res, v}] = true
					}
				}
			}
		}
	}
	for _, rb := range m.roleBindings {
		if !binds(rb.Subjects, rb.Namespace) {
			continue
		}
		where := "rolebinding " + rb.Namespace + "/" + rb.Name
		if rules, ok := m.roleRules(t, where, rb.Namespace, rb.RoleRef); ok {
			add(where, rb.Namespace, rules)
		}
	}
	for _, crb := range m.clusterRoleBindings {
		if !binds(crb.Subjects, "") {
			continue
		}
		where := "clusterrolebinding " + crb.Name
		if crb.RoleRef.Kind != "ClusterRole" {
			t.Errorf("%s: %s: roleRef kind %s, want ClusterRole", m.overlay, where, crb.RoleRef.Kind)
			continue
		}
		if rules, ok := m.roleRules(t, where, "", crb.RoleRef); ok {
			add(where, "", rules)
		}
	}
	return got
}

// roleRules are the rules of the Role (in ns) or ClusterRole ref names.
func (m *manifests) roleRules(t *testing.T, where, ns string, ref rbacv1.RoleRef) ([]rbacv1.PolicyRule, bool) {
	t.Helper()
	if ref.APIGroup != rbacv1.GroupName {
		t.Errorf("%s: %s: roleRef apiGroup %q, want %s", m.overlay, where, ref.APIGroup, rbacv1.GroupName)
		return nil, false
	}
	switch ref.Kind {
	case "Role":
		for _, r := range m.roles {
			if r.Namespace == ns && r.Name == ref.Name {
				return r.Rules, true
			}
		}
	case "ClusterRole":
		for _, r := range m.clusterRoles {
			if r.Name == ref.Name {
				if r.AggregationRule != nil {
					t.Errorf("%s: %s: ClusterRole %s aggregates others: what it grants is not in the overlay", m.overlay, where, r.Name)
					return nil, false
				}
				return r.Rules, true
			}
		}
	}
	t.Errorf("%s: %s: roleRef %s %s is not rendered (in namespace %q)", m.overlay, where, ref.Kind, ref.Name, ns)
	return nil, false
}

// checkGrants compares what a service account is granted with what it
// needs, both ways.
func checkGrants(t *testing.T, where string, got, want map[grant]bool) {
	t.Helper()
	var missing, extra []string
	for g := range want {
		if !got[g] {
			missing = append(missing, g.String())
		}
	}
	for g := range got {
		if !want[g] {
			extra = append(extra, g.String())
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 {
		t.Errorf("%s: not granted, and the pool executor calls them: %s", where, strings.Join(missing, "; "))
	}
	if len(extra) > 0 {
		t.Errorf("%s: granted, and nothing calls them: %s", where, strings.Join(extra, "; "))
	}
}

func (m *manifests) namespaceNamed(name string) *corev1.Namespace {
	for _, n := range m.namespaces {
		if n.Name == name {
			return n
		}
	}
	return nil
}

func (m *manifests) serviceAccount(ns, name string) *corev1.ServiceAccount {
	for _, sa := range m.serviceAccounts {
		if sa.Namespace == ns && sa.Name == name {
			return sa
		}
	}
	return nil
}

func (m *manifests) claim(ns, name string) *corev1.PersistentVolumeClaim {
	for _, c := range m.claims {
		if c.Namespace == ns && c.Name == name {
			return c
		}
	}
	return nil
}

// checkPoolExecutor checks the Kubernetes executor's flags of a
// fleetlearn-server container against the overlay: the service account
// it calls the API as, granted exactly what the executor calls (nothing
// without --pool-kubernetes); the pool namespace, the ranks' service
// account and checkpoint claim there; and, with --pool-kube-checkpoint-dir,
// a claim of the server's namespace mounted there that reaches the same
// storage as the ranks' claim.
func checkPoolExecutor(t *testing.T, m *manifests, sts *appsv1.StatefulSet, c *corev1.Container, f flagArgs) {
	t.Helper()
	where := m.overlay + ": " + sts.Name + "/" + c.Name
	pod := &sts.Spec.Template.Spec
	saName := cmp.Or(pod.ServiceAccountName, "default")
	checkGrants(t, where+": service account "+sts.Namespace+"/"+saName, m.grantsOf(t, sts.Namespace, saName), requiredGrants(f))
	cluster := f["pool-kubernetes"]
	if cluster == "" {
		for k := range f {
			if strings.HasPrefix(k, "pool-kube-") {
				t.Errorf("%s: --%s without --pool-kubernetes: the server refuses to start", where, k)
			}
		}
		return
	}
	if cluster != "in-cluster" {
		t.Errorf("%s: --pool-kubernetes=%s: in a pod the server reaches the API as its service account (in-cluster)", where, cluster)
	}
	sa := m.serviceAccount(sts.Namespace, saName)
	switch {
	case sa == nil:
		t.Errorf("%s: --pool-kubernetes=in-cluster as service account %s, which the overlay does not render with the server's grants", where, saName)
	case pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken,
		pod.AutomountServiceAccountToken == nil && sa.AutomountServiceAccountToken != nil && !*sa.AutomountServiceAccountToken:
		t.Errorf("%s: --pool-kubernetes=in-cluster, but the pod gets no service account token", where)
	}
	ns, _ := f.get("pool-kube-namespace", defaultPoolNamespace)
	if m.namespaceNamed(ns) == nil {
		t.Errorf("%s: --pool-kube-namespace=%s is not rendered", where, ns)
	}
	if img := f["pool-kube-image"]; img == "" || strings.ContainsAny(img, " \t\n") {
		t.Errorf("%s: --pool-kube-image=%q: want an image reference", where, img)
	}
	if ra := f["pool-kube-service-account"]; ra != "" {
		rsa := m.serviceAccount(ns, ra)
		if rsa == nil {
			t.Errorf("%s: --pool-kube-service-account=%s is not rendered in %s: the ranks' pods would never be created", where, ra, ns)
		} else if rsa.AutomountServiceAccountToken == nil || *rsa.AutomountServiceAccountToken {
			t.Errorf("%s: service account %s/%s mounts a token into the ranks, which run the jobs' code; set automountServiceAccountToken: false", where, ns, ra)
		}
		checkGrants(t, where+": the ranks' service account "+ns+"/"+ra, m.grantsOf(t, ns, ra), nil)
	}
	claimName := f["pool-kube-checkpoint-claim"]
	rankClaim := m.claim(ns, claimName)
	if rankClaim == nil {
		t.Errorf("%s: --pool-kube-checkpoint-claim=%s is not a claim rendered in %s, where the ranks' pods mount it", where, claimName, ns)
	} else if !slices.Contains(rankClaim.Spec.AccessModes, corev1.ReadWriteMany) {
		t.Errorf("%s: claim %s/%s is %v; the ranks of a job share it from several nodes: ReadWriteMany", where, ns, claimName, rankClaim.Spec.AccessModes)
	}
	dir := f["pool-kube-checkpoint-dir"]
	if dir == "" {
		return
	}
	vm, kind := mountHolding(sts, c, dir)
	name, ok := strings.CutPrefix(kind, "persistentVolumeClaim ")
	if !ok || vm.MountPath != dir {
		t.Errorf("%s: --pool-kube-checkpoint-dir=%s is not where a claim is mounted (%s at %s)", where, dir, kind, vm.MountPath)
		return
	}
	if serverClaim := m.claim(sts.Namespace, name); serverClaim != nil && rankClaim != nil {
		if err := m.sameStorage(rankClaim, serverClaim); err != nil {
			t.Errorf("%s: --pool-kube-checkpoint-dir=%s: claim %s/%s does not show the ranks' checkpoints: %v", where, dir, sts.Namespace, name, err)
		}
	}
}

// boundVolume is the PersistentVolume pvc is bound to in advance: named by
// its volumeName and naming it in claimRef, with its class, access modes
// and at least its size.
func (m *manifests) boundVolume(pvc *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	id := pvc.Namespace + "/" + pvc.Name
	if pvc.Spec.VolumeName == "" {
		return nil, fmt.Errorf("claim %s names no volume: it gets a volume of its own", id)
	}
	for _, pv := range m.volumes {
		if pv.Name != pvc.Spec.VolumeName {
			continue
		}
		ref := pv.Spec.ClaimRef
		req, have := pvc.Spec.Resources.Requests[corev1.ResourceStorage], pv.Spec.Capacity[corev1.ResourceStorage]
		switch {
		case ref == nil:
			return nil, fmt.Errorf("volume %s is not reserved for claim %s (no claimRef): another claim may bind it", pv.Name, id)
		case ref.Namespace != pvc.Namespace || ref.Name != pvc.Name:
			return nil, fmt.Errorf("volume %s is reserved for claim %s/%s, not %s", pv.Name, ref.Namespace, ref.Name, id)
		case pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != pv.Spec.StorageClassName:
			return nil, fmt.Errorf("claim %s asks for storage class %v, volume %s is %q: it would not bind (a default class would provision another)",
				id, pvc.Spec.StorageClassName, pv.Name, pv.Spec.StorageClassName)
		case slices.ContainsFunc(pvc.Spec.AccessModes, func(a corev1.PersistentVolumeAccessMode) bool { return !slices.Contains(pv.Spec.AccessModes, a) }):
			return nil, fmt.Errorf("claim %s wants %v, volume %s offers %v", id, pvc.Spec.AccessModes, pv.Name, pv.Spec.AccessModes)
		case have.Cmp(req) < 0:
			return nil, fmt.Errorf("claim %s wants %s, volume %s holds %s", id, req.String(), pv.Name, have.String())
		}
		return pv, nil
	}
	return nil, fmt.Errorf("claim %s names volume %s, which is not rendered", id, pvc.Spec.VolumeName)
}

// sameStorage reports why claims a and b would not show the same files.
func (m *manifests) sameStorage(a, b *corev1.PersistentVolumeClaim) error {
	if a == b {
		return nil
	}
	va, err := m.boundVolume(a)
	if err != nil {
		return err
	}
	vb, err := m.boundVolume(b)
	if err != nil {
		return err
	}
	na, nb := va.Spec.NFS, vb.Spec.NFS
	if na == nil || nb == nil {
		return fmt.Errorf("volumes %s and %s: only NFS volumes are known here to share their files", va.Name, vb.Name)
	}
	if na.Server != nb.Server || path.Clean(na.Path) != path.Clean(nb.Path) {
		return fmt.Errorf("volume %s is %s:%s, volume %s is %s:%s", va.Name, na.Server, na.Path, vb.Name, nb.Server, nb.Path)
	}
	return nil
}

// checkClaims checks that every claim bound in advance finds its volume,
// and every reserved volume its claim.
func checkClaims(t *testing.T, m *manifests) {
	t.Helper()
	for _, pvc := range m.claims {
		if _, err := m.boundVolume(pvc); pvc.Spec.VolumeName != "" && err != nil {
			t.Errorf("%s: %v", m.overlay, err)
		}
	}
	for _, pv := range m.volumes {
		if ref := pv.Spec.ClaimRef; ref == nil {
			t.Errorf("%s: volume %s has no claimRef: any claim of its class may bind it", m.overlay, pv.Name)
		} else if m.claim(ref.Namespace, ref.Name) == nil {
			t.Errorf("%s: volume %s is reserved for claim %s/%s, which is not rendered", m.overlay, pv.Name, ref.Namespace, ref.Name)
		}
	}
}

// checkBindings checks that every binding's subjects are service accounts
// the overlay renders, so that no grant lands on an account someone else
// may create.
func checkBindings(t *testing.T, m *manifests) {
	t.Helper()
	check := func(where, bindingNS string, subjects []rbacv1.Subject) {
		for _, s := range subjects {
			ns := cmp.Or(s.Namespace, bindingNS)
			if s.Kind != rbacv1.ServiceAccountKind || m.serviceAccount(ns, s.Name) == nil {
				t.Errorf("%s: %s: subject %s %s/%s is not a service account the overlay renders", m.overlay, where, s.Kind, ns, s.Name)
			}
		}
	}
	for _, rb := range m.roleBindings {
		check("rolebinding "+rb.Namespace+"/"+rb.Name, rb.Namespace, rb.Subjects)
	}
	for _, crb := range m.clusterRoleBindings {
		check("clusterrolebinding "+crb.Name, "", crb.Subjects)
	}
}

// TestKubernetesPoolExecutorCalls keeps poolExecutorAccess in step with
// server/internal/kube: the resources it names and the verbs of its
// dynamic client's calls are the table's.
func TestKubernetesPoolExecutorCalls(t *testing.T) {
	const dir = "../server/internal/kube"
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	calls := regexp.MustCompile(`\.(Create|Get|Update|UpdateStatus|Delete|DeleteCollection|List|Watch|Patch|Apply|ApplyStatus)\(ctx\b`)
	resources := regexp.MustCompile(`\.WithResource\("([a-z]+)"\)`)
	verbs, named := map[string]bool{}, map[string]bool{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range calls.FindAllSubmatch(b, -1) {
			verbs[strings.ToLower(string(c[1]))] = true
		}
		for _, r := range resources.FindAllSubmatch(b, -1) {
			named[string(r[1])] = true
		}
	}
	tableVerbs, tableResources := map[string]bool{}, map[string]bool{}
	for _, a := range poolExecutorAccess {
		tableResources[a.resource] = true
		for _, v := range a.verbs {
			tableVerbs[v] = true
		}
	}
	if len(verbs) == 0 || len(named) == 0 {
		t.Fatalf("found no API calls or resources in %s: the patterns here no longer match its source", dir)
	}
	if !maps.Equal(verbs, tableVerbs) {
		t.Errorf("%s calls %v; poolExecutorAccess (and rbac.yaml) grant %v", dir, slices.Sorted(maps.Keys(verbs)), slices.Sorted(maps.Keys(tableVerbs)))
	}
	if !maps.Equal(named, tableResources) {
		t.Errorf("%s uses resources %v; poolExecutorAccess has %v", dir, slices.Sorted(maps.Keys(named)), slices.Sorted(maps.Keys(tableResources)))
	}
}

// mountAt is the volume mount of c that holds p and what backs it:
// "claim" (a claim template), "persistentVolumeClaim NAME", "emptyDir",
// "configMap NAME" or "secret NAME".
func mountHolding(sts *appsv1.StatefulSet, c *corev1.Container, p string) (corev1.VolumeMount, string) {
	var best corev1.VolumeMount
	for _, vm := range c.VolumeMounts {
		if (p == vm.MountPath || strings.HasPrefix(p, strings.TrimSuffix(vm.MountPath, "/")+"/")) && len(vm.MountPath) > len(best.MountPath) {
			best = vm
		}
	}
	if best.Name == "" {
		return best, "the root file system"
	}
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name != best.Name {
			continue
		}
		switch {
		case v.Secret != nil:
			return best, "secret " + v.Secret.SecretName
		case v.ConfigMap != nil:
			return best, "configMap " + v.ConfigMap.Name
		case v.EmptyDir != nil:
			return best, "emptyDir"
		case v.PersistentVolumeClaim != nil:
			return best, "persistentVolumeClaim " + v.PersistentVolumeClaim.ClaimName
		}
		return best, "volume " + v.Name
	}
	for _, pvc := range sts.Spec.VolumeClaimTemplates {
		if pvc.Name == best.Name {
			return best, "claim"
		}
	}
	return best, "nothing"
}

func servicePort(svc *corev1.Service, port int32) bool {
	return slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == port })
}

// resolve is the Service an in-cluster DNS name reaches, and the pod with a
// StatefulSet pod's name under its headless Service.
func (m *manifests) resolve(host string) (*corev1.Service, string, error) {
	name := strings.TrimSuffix(host, ".")
	for _, suffix := range []string{"." + namespace + ".svc." + clusterDomain, "." + namespace + ".svc", "." + namespace, ""} {
		rest, ok := strings.CutSuffix(name, suffix)
		if !ok || rest == "" {
			continue
		}
		pod, svcName, isPod := strings.Cut(rest, ".")
		if !isPod {
			svcName, pod = rest, ""
		}
		if strings.Contains(svcName, ".") {
			continue
		}
		svc := m.service(svcName)
		if svc == nil {
			return nil, "", fmt.Errorf("%s: no service %s in namespace %s", host, svcName, namespace)
		}
		if pod == "" {
			return svc, "", nil
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			return nil, "", fmt.Errorf("%s: service %s is not headless, so it has no pod names", host, svcName)
		}
		for _, sts := range m.sets {
			i, err := strconv.Atoi(strings.TrimPrefix(pod, sts.Name+"-"))
			if sts.Spec.ServiceName == svcName && strings.HasPrefix(pod, sts.Name+"-") && err == nil &&
				i >= 0 && sts.Spec.Replicas != nil && i < int(*sts.Spec.Replicas) {
				return svc, pod, nil
			}
		}
		return nil, "", fmt.Errorf("%s: no pod %s under service %s", host, pod, svcName)
	}
	return nil, "", fmt.Errorf("%s: not a name in namespace %s of cluster domain %s", host, namespace, clusterDomain)
}

// checkURLs checks comma-separated NATS URLs that name this cluster:
// each reaches a Service port.
func checkURLs(t *testing.T, m *manifests, where, urls string, defPort int32) {
	t.Helper()
	for raw := range strings.SplitSeq(urls, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || u.Hostname() == "" {
			t.Errorf("%s: %q is not a URL", where, raw)
			continue
		}
		port := defPort
		if p := u.Port(); p != "" {
			n, _ := strconv.Atoi(p)
			port = int32(n)
		}
		svc, pod, err := m.resolve(u.Hostname())
		if err != nil {
			t.Errorf("%s: %v", where, err)
		} else if pod == "" && !servicePort(svc, port) {
			t.Errorf("%s: %s: service %s has no port %d", where, raw, svc.Name, port)
		}
	}
}

// TestKubernetesArgs runs each fleetlearn container's command line, its
// exec probes and hooks against the built binary's own flag parser: pflag
// parses in order, so an unknown flag or a value it cannot parse fails
// before --help answers.
func TestKubernetesArgs(t *testing.T) {
	dir := bins(t)
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			m := renderOverlay(t, overlay)
			for _, sts := range m.sets {
				for i := range sts.Spec.Template.Spec.Containers {
					c := &sts.Spec.Template.Spec.Containers[i]
					where := overlay + ": " + sts.Name + "/" + c.Name
					if prog := containerProgramOf(t, m, sts, c); isFleetlearn(prog.argv[0]) {
						checkCommandLine(t, dir, where, prog.argv)
					}
					for _, pr := range podProbes(c) {
						if pr.Exec != nil && len(pr.Exec.Command) > 0 && isFleetlearn(pr.Exec.Command[0]) {
							checkCommandLine(t, dir, where+": "+pr.name, pr.Exec.Command)
						}
					}
				}
			}
		})
	}
}

// checkCommandLine runs argv, with the program from dir and --help added,
// and requires it to succeed; a subcommand named in argv must be the one
// whose help answers (cobra prints the parent's help for an unknown one).
func checkCommandLine(t *testing.T, dir, where string, argv []string) {
	t.Helper()
	name := path.Base(argv[0])
	var sub []string
	for _, a := range argv[1:] {
		if strings.HasPrefix(a, "-") {
			break
		}
		sub = append(sub, a)
	}
	cmd := exec.Command(filepath.Join(dir, name), append(slices.Clone(argv[1:]), "--help")...)
	cmd.Env = []string{"HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("%s: %s %s --help: %v\n%s", where, name, strings.Join(argv[1:], " "), err, out)
		return
	}
	if len(sub) > 0 {
		if want := "\n  " + name + " " + strings.Join(sub, " "); !strings.Contains(string(out), want) {
			t.Errorf("%s: %s has no command %q: --help printed\n%s", where, name, strings.Join(sub, " "), out)
		}
	}
}

// TestKubernetesReplicaSecrets makes the replicas' secrets with the
// documented steps (fleetlearn-server replica-secrets and
// --write-nats-config, run with the built binary, then the Secrets as
// deploy/README.md's kubectl commands make them), lays the Secrets out as
// each replicated aggregator's pod mounts them, and checks that every file
// of server.ReplicaSecrets the steps wrote reaches the pod, as it is, where
// --secrets-from (or --nats-auth-from, for nats-auth/) takes it.
func TestKubernetesReplicaSecrets(t *testing.T) {
	dir := bins(t)
	tested := 0
	for _, overlay := range overlays {
		m := renderOverlay(t, overlay)
		for _, sts := range m.sets {
			for i := range sts.Spec.Template.Spec.Containers {
				c := &sts.Spec.Template.Spec.Containers[i]
				prog := containerProgramOf(t, m, sts, c)
				if path.Base(prog.argv[0]) != "fleetlearn-server" {
					continue
				}
				f, err := parseFlagArgs(prog.argv[1:])
				if err != nil || f["store"] == "" {
					continue // not a replica; TestKubernetesManifests checks the flags
				}
				tested++
				t.Run(overlay+"/"+sts.Name, func(t *testing.T) {
					auth := newNATSAuthority(t, dir)
					root := filepath.Join(t.TempDir(), "pod")
					mirrorPod(t, root, m, sts, c, auth.secrets(t, root))
					checkReplicaSecretsReach(t, auth.dir, root, f)
				})
			}
		}
	}
	if tested == 0 {
		t.Fatal("no overlay runs replicated aggregators")
	}
}

// checkReplicaSecretsReach compares each file below the entries of
// server.ReplicaSecrets in dir with what a pod whose file system is under
// root finds where the server's flags f take it from.
func checkReplicaSecretsReach(t *testing.T, dir, root string, f flagArgs) {
	t.Helper()
	n := 0
	for _, entry := range server.ReplicaSecrets {
		err := filepath.WalkDir(filepath.Join(dir, entry), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			n++
			rel, _ := filepath.Rel(dir, p)
			from := filepath.Join(root, f["secrets-from"], rel)
			if auth, ok := strings.CutPrefix(filepath.ToSlash(rel), server.NATSAuthDir+"/"); ok && f["nats-auth-from"] != "" {
				from = filepath.Join(root, f["nats-auth-from"], auth)
			}
			want, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			got, err := os.ReadFile(from)
			switch {
			case f["secrets-from"] == "":
				t.Errorf("%s: no --secrets-from to take it from", rel)
			case err != nil:
				t.Errorf("%s does not reach the pod: %v", rel, err)
			case !bytes.Equal(got, want):
				t.Errorf("%s reaches the pod as %s, with other content", rel, from)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: %v", entry, err)
		}
	}
	if n == 0 {
		t.Error("the documented step wrote none of server.ReplicaSecrets")
	}
}

// TestKubernetesNATSConfig checks each NATS container's configuration with
// nats-server's own parser, on a copy of the pod's files: the ConfigMap
// where it is mounted, and the fragment the documented step writes (run
// with the built fleetlearn-server) where its Secret is mounted. It then
// checks the container's probes, ports, paths and routes against what that
// configuration serves, and the Secrets' keys against what the step wrote.
func TestKubernetesNATSConfig(t *testing.T) {
	dir := bins(t)
	tested := 0
	for _, overlay := range overlays {
		m := renderOverlay(t, overlay)
		opts := map[*corev1.Container][]portListener{}
		for _, sts := range m.sets {
			for i := range sts.Spec.Template.Spec.Containers {
				c := &sts.Spec.Template.Spec.Containers[i]
				if len(c.Command) == 0 || path.Base(c.Command[0]) != "nats-server" {
					continue
				}
				tested++
				t.Run(overlay+"/"+sts.Name, func(t *testing.T) {
					opts[c] = checkNATSContainer(t, dir, m, sts, c)
				})
			}
		}
		checkServices(t, m, opts)
		// The aggregator's NATS URLs reach a NATS client port.
		for _, sts := range m.sets {
			for i := range sts.Spec.Template.Spec.Containers {
				c := &sts.Spec.Template.Spec.Containers[i]
				prog := containerProgramOf(t, m, sts, c)
				if path.Base(prog.argv[0]) != "fleetlearn-server" {
					continue
				}
				f, err := parseFlagArgs(prog.argv[1:])
				if err != nil {
					continue // TestKubernetesManifests says so
				}
				for _, fl := range []string{"nats-url", "nats-advertise"} {
					for raw := range strings.SplitSeq(f[fl], ",") {
						if raw != "" {
							checkReachesNATS(t, m, overlay+": "+sts.Name+": --"+fl, raw, opts)
						}
					}
				}
			}
		}
	}
	if tested == 0 {
		t.Fatal("no overlay runs nats-server")
	}
}

func checkReachesNATS(t *testing.T, m *manifests, where, raw string, ls map[*corev1.Container][]portListener) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	svc, _, err := m.resolve(u.Hostname())
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	for _, sp := range svc.Spec.Ports {
		if strconv.Itoa(int(sp.Port)) != u.Port() {
			continue
		}
		for _, sts := range m.sets {
			if !selects(svc, sts) {
				continue
			}
			target := sp.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(sp.Port)
			}
			if c, n := targetContainer(sts, &target); c != nil {
				if l, ok := listenerAt(ls[c], n); ok && l.speaks == "nats" {
					return
				}
			}
		}
	}
	t.Errorf("%s: %s reaches no NATS client port", where, raw)
}

func checkNATSContainer(t *testing.T, dir string, m *manifests, sts *appsv1.StatefulSet, c *corev1.Container) []portListener {
	t.Helper()
	where := m.overlay + ": " + sts.Name + "/" + c.Name
	root := filepath.Join(t.TempDir(), "pod") // the pod's file system: root+"/etc/nats" is its /etc/nats
	secrets := newNATSAuthority(t, dir).secrets(t, root)
	for name, want := range documentedSecrets {
		have := slices.Sorted(maps.Keys(secrets[name]))
		if !slices.Equal(have, want) {
			t.Errorf("the documented step gives Secret %s the keys %v; the table here says %v", name, have, want)
		}
	}
	mirrorPod(t, root, m, sts, c, secrets)
	env := podEnv(t, m, sts, c, sts.Name+"-0")
	opts, confPath, conf := natsOptions(t, where, root, sts, c, env)

	// nats-server resolves an include relative to the including file, even
	// an absolute path.
	includes := regexp.MustCompile(`(?m)^\s*include\s+["']?([^"'\s;]+)`).FindAllSubmatch(conf, -1)
	fragmentAt := ""
	for _, inc := range includes {
		p := path.Join(path.Dir(confPath), string(inc[1]))
		if _, kind := mountHolding(sts, c, p); kind == "secret nats-fleetlearn-auth" {
			fragmentAt = p
		}
	}
	if fragmentAt == "" {
		t.Errorf("%s: %s includes no file of Secret nats-fleetlearn-auth: the cluster would not trust the aggregator's operator", where, confPath)
	}

	if len(opts.TrustedOperators) == 0 || opts.SystemAccount == "" || opts.AccountResolver == nil {
		t.Errorf("%s: not in operator mode (operators %d, system account %q, resolver %v): any client could connect",
			where, len(opts.TrustedOperators), opts.SystemAccount, opts.AccountResolver)
	}
	if !opts.JetStream {
		t.Errorf("%s: JetStream is off; the aggregator keeps reports and blobs there", where)
	}
	if opts.MaxPayload != wire.MaxMessageBytes {
		t.Errorf("%s: max_payload %d, want the aggregator's wire.MaxMessageBytes %d", where, opts.MaxPayload, wire.MaxMessageBytes)
	}
	if want := env["POD_NAME"]; opts.ServerName != want || want == "" {
		t.Errorf("%s: server_name %q, want the pod's name %q", where, opts.ServerName, want)
	}
	for what, p := range map[string]string{"jetstream store_dir": opts.StoreDir, "pid_file": opts.PidFile, "the resolver directory": natsResolverDir} {
		vm, kind := mountHolding(sts, c, p)
		if kind != "claim" && kind != "emptyDir" || vm.ReadOnly {
			t.Errorf("%s: %s %s is not on a writable volume (%s): the root file system is read-only", where, what, p, kind)
		}
		if what != "pid_file" && kind != "claim" {
			t.Errorf("%s: %s %s is not on the node's claim (%s): it would be lost with the pod", where, what, p, kind)
		}
	}
	if pre := c.Lifecycle; pre == nil || pre.PreStop == nil || pre.PreStop.Exec == nil {
		t.Errorf("%s: no preStop hook: a stopping node would drop its clients instead of handing them over", where)
	} else if cmd := pre.PreStop.Exec.Command; !slices.Contains(cmd, "ldm="+opts.PidFile) || path.Base(cmd[0]) != "nats-server" {
		t.Errorf("%s: preStop %q does not signal lame-duck mode to the pid file %s", where, cmd, opts.PidFile)
	}

	// The image runs the version whose parser checked this.
	version := ""
	if b, err := os.ReadFile("../go.mod"); err != nil {
		t.Error(err)
	} else if mf, err := modfile.ParseLax("go.mod", b, nil); err != nil {
		t.Error(err)
	} else {
		for _, r := range mf.Require {
			if r.Mod.Path == "github.com/nats-io/nats-server/v2" {
				version = strings.TrimPrefix(r.Mod.Version, "v")
			}
		}
	}
	if _, tag, _ := strings.Cut(c.Image, ":"); version == "" || tag != version && !strings.HasPrefix(tag, version+"-") {
		t.Errorf("%s: image %s, but the parser that checked it is nats-server %q", where, c.Image, version)
	}

	ls := []portListener{
		{host: opts.Host, port: int32(opts.Port), speaks: "nats", flag: "listen"},
		{host: opts.HTTPHost, port: int32(opts.HTTPPort), speaks: "http", flag: "http",
			paths: []string{"/healthz*", "/varz", "/jsz", "/connz", "/routez", "/subsz", "/accountz"}},
		{host: opts.Cluster.Host, port: int32(opts.Cluster.Port), speaks: "nats-route", flag: "cluster listen"},
	}
	checkListeners(t, where, c, ls)

	// Every node is a route, by the name its headless Service gives it.
	var pods []string
	for _, r := range opts.Routes {
		svc, pod, err := m.resolve(r.Hostname())
		switch {
		case err != nil:
			t.Errorf("%s: route %s: %v", where, r, err)
		case pod == "" || !selects(svc, sts):
			t.Errorf("%s: route %s is not a pod of %s", where, r, sts.Name)
		case r.Port() != strconv.Itoa(opts.Cluster.Port):
			t.Errorf("%s: route %s: the cluster listens on %d", where, r, opts.Cluster.Port)
		default:
			pods = append(pods, pod)
		}
	}
	if sts.Spec.Replicas == nil || len(pods) != int(*sts.Spec.Replicas) {
		t.Errorf("%s: routes to %v, want each of the %v replicas", where, pods, sts.Spec.Replicas)
	}
	return ls
}

// natsAuthority is the data directory of the documented one-time step,
// fleetlearn-server --data-dir fleetlearn-nats-auth --write-nats-config …,
// run with the built binary.
type natsAuthority struct{ bin, dir string }

func newNATSAuthority(t *testing.T, bins string) *natsAuthority {
	t.Helper()
	return &natsAuthority{bin: filepath.Join(bins, "fleetlearn-server"), dir: filepath.Join(t.TempDir(), "fleetlearn-nats-auth")}
}

// secrets are the contents of the Secrets the documented steps create,
// by Secret and key, with the fragment's resolver directory where a pod
// whose file system is under root has /data/jwt. The replicas' secrets
// (fleetlearn-server replica-secrets) are made in the same directory as
// the NATS authority, as the replicated overlay's steps do.
func (a *natsAuthority) secrets(t *testing.T, root string) map[string]map[string][]byte {
	t.Helper()
	if out, err := exec.Command(a.bin, "replica-secrets", "--data-dir", a.dir).CombinedOutput(); err != nil {
		t.Fatalf("fleetlearn-server replica-secrets: %v\n%s", err, out)
	}
	fragment := filepath.Join(t.TempDir(), "fleetlearn-auth.conf")
	step := exec.Command(a.bin, "--data-dir", a.dir, "--write-nats-config", fragment,
		"--nats-resolver-dir", filepath.Join(root, natsResolverDir))
	if out, err := step.CombinedOutput(); err != nil {
		t.Fatalf("fleetlearn-server --write-nats-config: %v\n%s", err, out)
	}
	b, err := os.ReadFile(fragment)
	if err != nil {
		t.Fatal(err)
	}
	// --from-file=fleetlearn-nats-auth/nats-auth/: a key per regular file.
	keys := map[string][]byte{}
	entries, err := os.ReadDir(filepath.Join(a.dir, "nats-auth"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			if keys[e.Name()], err = os.ReadFile(filepath.Join(a.dir, "nats-auth", e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	// --from-file=fleetlearn-replica/tls/ca.crt …: a key per file, by its
	// base name.
	replica := map[string][]byte{}
	for _, f := range replicaSecretFiles {
		if replica[path.Base(f)], err = os.ReadFile(filepath.Join(a.dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return map[string]map[string][]byte{
		"nats-fleetlearn-auth":       {filepath.Base(fragment): b},
		"fleetlearn-nats-auth":       keys,
		"fleetlearn-replica-secrets": replica,
		"fleetlearn-postgres":        {"password": []byte("not-the-real-one")},
	}
}

// mirrorPod lays out c's volumes under root as the kubelet would in the
// pod: ConfigMaps from the overlay, Secrets from secrets, each key at the
// path its volume's items give it, empty directories for the rest.
func mirrorPod(t *testing.T, root string, m *manifests, sts *appsv1.StatefulSet, c *corev1.Container, secrets map[string]map[string][]byte) {
	t.Helper()
	volumes := map[string]*corev1.Volume{}
	for i := range sts.Spec.Template.Spec.Volumes {
		volumes[sts.Spec.Template.Spec.Volumes[i].Name] = &sts.Spec.Template.Spec.Volumes[i]
	}
	for _, vm := range c.VolumeMounts {
		dst := filepath.Join(root, vm.MountPath)
		if err := os.MkdirAll(dst, 0o700); err != nil {
			t.Fatal(err)
		}
		_, kind := mountHolding(sts, c, vm.MountPath)
		var files map[string][]byte
		if name, ok := strings.CutPrefix(kind, "configMap "); ok && m.configMaps[name] != nil {
			files = map[string][]byte{}
			for k, v := range m.configMaps[name].Data {
				files[k] = []byte(v)
			}
		} else if name, ok := strings.CutPrefix(kind, "secret "); ok {
			if files = secrets[name]; files == nil {
				t.Errorf("%s/%s mounts Secret %s, whose content no check here knows", sts.Name, c.Name, name)
			}
		}
		var items []corev1.KeyToPath
		if v := volumes[vm.Name]; v != nil && v.Secret != nil {
			items = v.Secret.Items
		} else if v != nil && v.ConfigMap != nil {
			items = v.ConfigMap.Items
		}
		if len(items) > 0 {
			projected := map[string][]byte{}
			for _, it := range items {
				b, ok := files[it.Key]
				if !ok {
					t.Errorf("%s/%s: volume %s: item %s is not a key of what it mounts", sts.Name, c.Name, vm.Name, it.Key)
				}
				projected[it.Path] = b
			}
			files = projected
		}
		for k, v := range files {
			p := filepath.Join(dst, k)
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, v, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// natsOptions parses the nats-server command line of c, in the pod whose
// volumes mirrorPod laid out under root and with env, as nats-server
// does; it returns the options, the configuration file's path in the pod
// and its text.
func natsOptions(t *testing.T, where, root string, sts *appsv1.StatefulSet, c *corev1.Container, env map[string]string) (*natsserver.Options, string, []byte) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	args := slices.Concat(c.Command[1:], c.Args)
	confPath := ""
	for i, a := range args {
		switch {
		case (a == "--config" || a == "-config" || a == "-c") && i+1 < len(args):
			confPath = args[i+1]
			args[i+1] = filepath.Join(root, confPath)
		case strings.HasPrefix(a, "--config="):
			confPath = strings.TrimPrefix(a, "--config=")
			args[i] = "--config=" + filepath.Join(root, confPath)
		}
	}
	if confPath == "" {
		t.Fatalf("%s: nats-server %q: no --config", where, args)
	}
	if vm, kind := mountHolding(sts, c, confPath); !strings.HasPrefix(kind, "configMap ") || !vm.ReadOnly {
		t.Errorf("%s: --config %s is not in a read-only ConfigMap volume (%s)", where, confPath, kind)
	}
	conf, err := os.ReadFile(filepath.Join(root, confPath))
	if err != nil {
		t.Fatalf("%s: --config %s: %v", where, confPath, err)
	}
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	opts, err := natsserver.ConfigureOptions(fs, args, func() {}, func() {}, func() {})
	if err != nil {
		t.Fatalf("%s: nats-server %s: %v", where, strings.Join(args, " "), err)
	}
	return opts, confPath, conf
}

// dockerfile is what the final stage of a Dockerfile sets, and the lines
// of its build stages.
type dockerfile struct {
	name             string
	from             string   // the final stage's base image
	user             string   // the final stage's USER
	entrypoint, cmd  []string // exec form
	healthcheck      []string // CMD, exec form
	env              map[string]string
	volumes, exposed []string
	copies           [][]string // final stage's COPY lines, options left out: sources…, destination
	build            []string   // the earlier stages' RUN and ENV lines
	comments         string     // every comment, continuations joined
}

// dockerfileLines reads a Dockerfile as BuildKit does: its instructions,
// each with its continuation lines joined, and every comment, with the
// comments' own continuations joined.
func dockerfileLines(t *testing.T, name string) (lines []string, comments string) {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cs []string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if c, ok := strings.CutPrefix(line, "#"); ok {
			cs = append(cs, strings.TrimSpace(c))
			continue
		}
		if line == "" && cur.Len() == 0 {
			continue
		}
		if l, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(l + " ")
			continue
		}
		cur.WriteString(line)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines, strings.ReplaceAll(strings.Join(cs, "\n"), "\\\n", " ")
}

func parseDockerfile(t *testing.T, name string) *dockerfile {
	t.Helper()
	d := &dockerfile{name: name, env: map[string]string{}}
	var lines []string
	lines, d.comments = dockerfileLines(t, name)
	execForm := func(instr, s string) []string {
		var argv []string
		if err := json.Unmarshal([]byte(s), &argv); err != nil || len(argv) == 0 {
			t.Errorf("%s: %s %s: want the exec form, a JSON array (distroless has no shell): %v", name, instr, s, err)
		}
		return argv
	}
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			d.build = append(d.build, d.env2lines()...)
			f := strings.Fields(rest)
			d.from, d.user, d.entrypoint, d.cmd, d.healthcheck = f[0], "", nil, nil, nil
			d.env, d.volumes, d.exposed, d.copies = map[string]string{}, nil, nil, nil
		case "RUN":
			d.build = append(d.build, rest)
		case "ENV":
			f := strings.Fields(rest)
			if len(f) > 0 && !strings.Contains(f[0], "=") {
				d.env[f[0]] = strings.Join(f[1:], " ")
				break
			}
			for _, kv := range f {
				k, v, _ := strings.Cut(kv, "=")
				d.env[k] = strings.Trim(v, `"`)
			}
		case "USER":
			d.user = rest
		case "VOLUME":
			d.volumes = append(d.volumes, strings.Fields(rest)...)
		case "EXPOSE":
			d.exposed = append(d.exposed, strings.Fields(rest)...)
		case "COPY":
			var args []string
			for _, a := range strings.Fields(rest) {
				if !strings.HasPrefix(a, "--") {
					args = append(args, a)
				}
			}
			d.copies = append(d.copies, args)
		case "ENTRYPOINT":
			d.entrypoint = execForm("ENTRYPOINT", rest)
		case "CMD":
			d.cmd = execForm("CMD", rest)
		case "HEALTHCHECK":
			f := strings.Fields(rest)
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				f = f[1:]
			}
			if len(f) == 0 || f[0] != "CMD" {
				t.Errorf("%s: HEALTHCHECK %s: want HEALTHCHECK [options] CMD [...]", name, rest)
				break
			}
			_, cmd, _ := strings.Cut(rest, " CMD ")
			d.healthcheck = execForm("HEALTHCHECK", strings.TrimSpace(cmd))
		}
	}
	return d
}

// env2lines are the ENV settings of a stage as lines of the build record.
func (d *dockerfile) env2lines() []string {
	var l []string
	for k, v := range d.env {
		l = append(l, "ENV "+k+"="+v)
	}
	return l
}

// imageChecks are what each image must hold and serve.
var imageChecks = []struct {
	dockerfile string
	binaries   []string // built and copied to /usr/local/bin
	dataDir    string   // the volume, and the value of dirFlag
	dirFlag    string
}{
	{"docker/Dockerfile.server", []string{"fleetlearn-server", "fleetlearn"}, "/var/lib/fleetlearn", "data-dir"},
	{"docker/Dockerfile.edge", []string{"fleetlearn-edge"}, "/var/lib/fleetlearn-edge", "data-dir"},
	{"docker/Dockerfile.worker", []string{"fleetlearn-worker"}, "/var/lib/fleetlearn-worker", "work-dir"},
}

// workerSecrets is where the worker image reads the files it is given:
// Docker's and Compose's secrets directory.
const workerSecrets = "/run/secrets/"

// TestDockerImages checks what the images build and run: static,
// trimmed binaries on distroless as non-root; a command line whose data
// directory is the volume, whose listeners are exposed and whose health
// check reaches one; and, with the built binaries, that each of their
// command lines (and the documented enrollment into the edge volume)
// passes the binary's own flag parser.
func TestDockerImages(t *testing.T) {
	dir := ""
	if !testing.Short() {
		dir = bins(t)
	}
	for _, ic := range imageChecks {
		t.Run(path.Base(ic.dockerfile), func(t *testing.T) {
			d := parseDockerfile(t, ic.dockerfile)
			if d.from != "gcr.io/distroless/static-debian12:nonroot" || d.user != "65532:65532" {
				t.Errorf("%s: runs on %s as %q, want gcr.io/distroless/static-debian12:nonroot as 65532:65532", d.name, d.from, d.user)
			}
			build := strings.Join(d.build, "\n")
			if !strings.Contains(build, "CGO_ENABLED=0") || !strings.Contains(build, "-trimpath") {
				t.Errorf("%s: the build stage must set CGO_ENABLED=0 and build with -trimpath:\n%s", d.name, build)
			}
			for _, b := range ic.binaries {
				if !regexp.MustCompile(`go build .*\./cmd/` + regexp.QuoteMeta(b) + `(\s|$)`).MatchString(build) {
					t.Errorf("%s: does not build ./cmd/%s", d.name, b)
				}
				if !slices.ContainsFunc(d.copies, func(c []string) bool {
					return len(c) > 1 && slices.Contains(c[:len(c)-1], "/out/"+b) && c[len(c)-1] == "/usr/local/bin/"
				}) {
					t.Errorf("%s: does not copy %s to /usr/local/bin/", d.name, b)
				}
			}
			if !slices.Equal(d.volumes, []string{ic.dataDir}) {
				t.Errorf("%s: VOLUME %v, want %s", d.name, d.volumes, ic.dataDir)
			}
			argv := slices.Concat(d.entrypoint, d.cmd)
			if len(argv) == 0 || argv[0] != "/usr/local/bin/"+ic.binaries[0] {
				t.Fatalf("%s: runs %q, want /usr/local/bin/%s", d.name, argv, ic.binaries[0])
			}
			f, err := parseFlagArgs(argv[1+len(subcommand(argv)):])
			if err != nil {
				t.Fatalf("%s: %v", d.name, err)
			}
			if got := f[ic.dirFlag]; got != ic.dataDir {
				t.Errorf("%s: --%s=%s, want the volume %s", d.name, ic.dirFlag, got, ic.dataDir)
			}
			var ls []portListener
			switch ic.binaries[0] {
			case "fleetlearn-server":
				ls = serverListeners(f)
				// docker run IMAGE --public-host=… adds to the command
				// line instead of replacing its listen addresses.
				if len(d.cmd) > 0 {
					t.Errorf("%s: CMD %q: arguments to docker run would replace it; put fixed flags in ENTRYPOINT", d.name, d.cmd)
				}
				for k, want := range map[string]string{
					"FLEETLEARN_CA":         path.Join(ic.dataDir, "tls", "ca.crt"),
					"FLEETLEARN_TOKEN_FILE": path.Join(ic.dataDir, "admin.token"),
				} {
					if d.env[k] != want {
						t.Errorf("%s: ENV %s=%q, want %q for docker exec … fleetlearn", d.name, k, d.env[k], want)
					}
				}
			case "fleetlearn-edge":
				ls = edgeListeners(f)
				if _, ok := f["nats-url"]; ok {
					t.Errorf("%s: --nats-url in the image: the agent must use the URL enrollment stored", d.name)
				}
				if len(d.entrypoint) != 1 {
					t.Errorf("%s: ENTRYPOINT %q: flags there would come before `enroll` in docker run IMAGE enroll …", d.name, d.entrypoint)
				}
			case "fleetlearn-worker":
				// The agent listens on nothing.
				if len(d.entrypoint) != 1 || !slices.Equal(subcommand(argv), []string{"run"}) {
					t.Errorf("%s: ENTRYPOINT %q CMD %q, want the binary alone and CMD [\"run\", …], so docker run IMAGE version works",
						d.name, d.entrypoint, d.cmd)
				}
				for _, k := range []string{"ca", "token-file"} {
					if !strings.HasPrefix(f[k], workerSecrets) {
						t.Errorf("%s: --%s=%s, want a file mounted in %s", d.name, k, f[k], workerSecrets)
					}
				}
				if f["server"] == "" {
					t.Errorf("%s: the default command has no --server", d.name)
				}
			}
			var ports []string
			for _, l := range ls {
				if l.everyInterface() {
					ports = append(ports, strconv.Itoa(int(l.port)))
				}
			}
			exposed := slices.Clone(d.exposed)
			slices.Sort(ports)
			slices.Sort(exposed)
			if !slices.Equal(ports, exposed) {
				t.Errorf("%s: EXPOSE %v, but it listens on every interface on %v", d.name, d.exposed, ports)
			}
			if ic.binaries[0] == "fleetlearn-worker" {
				// No health endpoint: a HEALTHCHECK could only fail.
				if len(d.healthcheck) > 0 {
					t.Errorf("%s: HEALTHCHECK %q: the agent serves no health check", d.name, d.healthcheck)
				}
			} else {
				checkHealthcheck(t, d, ls)
			}

			// The documented command line that replaces the worker's CMD.
			var workerRun []string
			if ic.binaries[0] == "fleetlearn-worker" {
				m := regexp.MustCompile(`\bfleetlearn-worker\s+run( [^\n]*)`).FindStringSubmatch(d.comments)
				if m == nil {
					t.Errorf("%s: no comment shows docker run … fleetlearn-worker run …", d.name)
				} else {
					workerRun = append([]string{"/usr/local/bin/fleetlearn-worker", "run"}, strings.Fields(m[1])...)
					wf, err := parseFlagArgs(workerRun[2:])
					if err != nil || wf[ic.dirFlag] != ic.dataDir || wf["ca"] != f["ca"] || wf["token-file"] != f["token-file"] {
						t.Errorf("%s: the docker run comment gives --%s %q, --ca %q, --token-file %q; want the volume %s and the CMD's files (%v)",
							d.name, ic.dirFlag, wf[ic.dirFlag], wf["ca"], wf["token-file"], ic.dataDir, err)
					}
				}
			}

			// The documented enrollment into the volume.
			var enroll []string
			if ic.binaries[0] == "fleetlearn-edge" {
				m := regexp.MustCompile(`\bfleetlearn-edge enroll( [^\n]*)`).FindStringSubmatch(d.comments)
				if m == nil {
					t.Errorf("%s: no comment shows docker run … fleetlearn-edge enroll …", d.name)
				} else {
					enroll = append([]string{"/usr/local/bin/fleetlearn-edge", "enroll"}, strings.Fields(m[1])...)
					ef, err := parseFlagsLoose(enroll[2:])
					if err != nil || ef["data-dir"] != ic.dataDir {
						t.Errorf("%s: the enrollment comment enrolls into --data-dir %q, want the volume %s (%v)", d.name, ef["data-dir"], ic.dataDir, err)
					}
				}
			}
			if dir == "" {
				return
			}
			checkCommandLine(t, dir, d.name+": ENTRYPOINT and CMD", argv)
			if ic.binaries[0] == "fleetlearn-server" {
				checkCommandLine(t, dir, d.name+": docker run IMAGE --public-host=…", append(slices.Clone(argv), "--public-host=aggregator.example.net"))
				checkCommandLine(t, dir, d.name+": docker exec … fleetlearn task list", []string{"/usr/local/bin/fleetlearn", "task", "list"})
			}
			if len(d.healthcheck) > 0 {
				checkCommandLine(t, dir, d.name+": HEALTHCHECK", d.healthcheck)
			}
			if enroll != nil {
				checkCommandLine(t, dir, d.name+": enrollment comment", enroll)
			}
			if workerRun != nil {
				checkCommandLine(t, dir, d.name+": docker run comment", workerRun)
			}
		})
	}
}

// subcommand is the words of argv after the program and before the first
// flag.
func subcommand(argv []string) []string {
	i := 1
	for i < len(argv) && !strings.HasPrefix(argv[i], "-") {
		i++
	}
	return argv[1:i]
}

// parseFlagsLoose reads "--name value" and "--name=value" alike, for
// command lines shown to operators; every flag there takes a value.
func parseFlagsLoose(args []string) (flagArgs, error) {
	f := flagArgs{}
	for i := 0; i < len(args); i++ {
		name, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			return nil, fmt.Errorf("argument %q: want a flag", args[i])
		}
		if n, v, ok := strings.Cut(name, "="); ok {
			f[n] = v
			continue
		}
		if i+1 == len(args) {
			return nil, fmt.Errorf("--%s has no value", name)
		}
		f[name] = args[i+1]
		i++
	}
	return f, nil
}

// checkHealthcheck checks that the HEALTHCHECK runs the image's binary's
// health command against one of its HTTP listeners, from inside the
// container.
func checkHealthcheck(t *testing.T, d *dockerfile, ls []portListener) {
	t.Helper()
	hc := d.healthcheck
	if len(hc) < 2 || hc[0] != d.entrypoint[0] || hc[1] != "health" {
		t.Errorf("%s: HEALTHCHECK %q, want %s health", d.name, hc, d.entrypoint[0])
		return
	}
	f, err := parseFlagsLoose(hc[2:])
	if err != nil {
		t.Errorf("%s: HEALTHCHECK: %v", d.name, err)
		return
	}
	addr, _ := f.get("addr", "127.0.0.1:9464") // the health command's default: the server's metrics listener
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: HEALTHCHECK --addr %s: %v", d.name, addr, err)
		return
	}
	for _, l := range ls {
		if strconv.Itoa(int(l.port)) == p && l.speaks == "http" && servesPath(l.paths, "/readyz") &&
			(l.everyInterface() || l.host == h) && net.ParseIP(h) != nil && net.ParseIP(h).IsLoopback() {
			return
		}
	}
	t.Errorf("%s: HEALTHCHECK asks %s, where nothing in the container serves /readyz (listeners %+v)", d.name, addr, ls)
}

// TestKubernetesExternalNATSRuns runs the external-nats overlay as
// rendered: its NATS nodes (in this process) with the ConfigMap's nats.conf
// and the fragment of the documented step, and the built fleetlearn-server
// with its container's command line and the keys Secret, until /readyz
// answers 200 and the CLI, with the container's environment, lists tasks.
// Only what a pod has and this machine lacks is moved: the pods' paths
// into temporary directories, the listen ports to free ones on loopback
// (the Services' names and the routes with them).
func TestKubernetesExternalNATSRuns(t *testing.T) {
	dir := bins(t)
	m := renderOverlay(t, "external-nats")
	natsSet, serverSet := m.set("nats"), m.set("fleetlearn-server")
	if natsSet == nil || serverSet == nil || natsSet.Spec.Replicas == nil {
		t.Fatal("external-nats renders no nats or fleetlearn-server StatefulSet")
	}
	nc, sc := &natsSet.Spec.Template.Spec.Containers[0], &serverSet.Spec.Template.Spec.Containers[0]
	auth := newNATSAuthority(t, dir)

	n := int(*natsSet.Spec.Replicas)
	clientPorts, routes := make([]int, n), make([]*url.URL, n)
	for i := range n {
		clientPorts[i] = freeLoopbackPort(t)
		routes[i] = &url.URL{Scheme: "nats", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(freeLoopbackPort(t)))}
	}
	var nodes []*natsserver.Server
	for i := range n {
		pod := fmt.Sprintf("%s-%d", natsSet.Name, i)
		root := filepath.Join(t.TempDir(), "pod")
		mirrorPod(t, root, m, natsSet, nc, auth.secrets(t, root))
		opts, _, _ := natsOptions(t, pod, root, natsSet, nc, podEnv(t, m, natsSet, nc, pod))
		opts.Host, opts.Port = "127.0.0.1", clientPorts[i]
		opts.HTTPPort = 0 // the probes' port; TestKubernetesNATSConfig checks it
		opts.Cluster.Host = "127.0.0.1"
		opts.Cluster.Port, _ = strconv.Atoi(routes[i].Port())
		opts.Routes = routes
		opts.StoreDir = filepath.Join(root, opts.StoreDir)
		opts.PidFile = filepath.Join(root, opts.PidFile)
		opts.NoSigs = true
		s, err := natsserver.NewServer(opts)
		if err != nil {
			t.Fatalf("%s: %v", pod, err)
		}
		go s.Start()
		t.Cleanup(s.Shutdown)
		nodes = append(nodes, s)
	}
	// As the nodes' startup probes (/healthz) wait: the cluster has formed
	// and JetStream is current on each.
	for i, s := range nodes {
		if !s.ReadyForConnections(kpGuard) {
			t.Fatalf("%s-%d is not accepting connections", natsSet.Name, i)
		}
		h := &natsserver.HealthStatus{}
		for start := time.Now(); time.Since(start) < kpGuard; time.Sleep(100 * time.Millisecond) {
			if h = s.Healthz(&natsserver.HealthzOptions{}); h.StatusCode == http.StatusOK {
				break
			}
		}
		if h.StatusCode != http.StatusOK {
			t.Fatalf("%s-%d: /healthz: %d %s %s (routes %d)", natsSet.Name, i, h.StatusCode, h.Status, h.Error, s.NumRoutes())
		}
	}

	// The aggregator's pod.
	root := filepath.Join(t.TempDir(), "pod")
	mirrorPod(t, root, m, serverSet, sc, auth.secrets(t, root))
	prog := containerProgramOf(t, m, serverSet, sc)
	grpcAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freeLoopbackPort(t)))
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freeLoopbackPort(t)))
	var args []string
	for _, a := range prog.argv[1:] {
		name, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		switch name {
		case "data-dir", "nats-auth-from":
			v = filepath.Join(root, v)
		case "grpc-addr":
			v = grpcAddr
		case "metrics-addr":
			v = metricsAddr
		case "nats-url":
			var urls []string
			for raw := range strings.SplitSeq(v, ",") {
				u, err := url.Parse(raw)
				if err != nil {
					t.Fatal(err)
				}
				if svc, _, err := m.resolve(u.Hostname()); err != nil || !selects(svc, natsSet) {
					t.Fatalf("--nats-url %s does not reach the nats pods (%v)", raw, err)
				}
				for _, p := range clientPorts {
					urls = append(urls, "nats://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
				}
			}
			v = strings.Join(urls, ",")
		}
		args = append(args, "--"+name+"="+v)
	}
	logFile := filepath.Join(t.TempDir(), "fleetlearn-server.log")
	out, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	srv := exec.Command(filepath.Join(dir, "fleetlearn-server"), args...)
	srv.Env, srv.Stdout, srv.Stderr = []string{"HOME=" + t.TempDir()}, out, out
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		_ = srv.Process.Signal(os.Interrupt)
		<-exited
	})
	serverLog := func() string { b, _ := os.ReadFile(logFile); return kpTail(string(b), 4000) }

	// /readyz: the store, NATS and the round coordinator are up.
	ready := false
	for start := time.Now(); !ready && time.Since(start) < kpGuard; {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("fleetlearn-server %s exited: %v\n%s", strings.Join(args, " "), err, serverLog())
		case <-time.After(200 * time.Millisecond):
		}
		resp, err := http.Get("http://" + metricsAddr + "/readyz")
		if err == nil {
			ready = resp.StatusCode == http.StatusOK
			resp.Body.Close()
		}
	}
	if !ready {
		t.Fatalf("fleetlearn-server %s: /readyz did not answer 200 within %v\n%s", strings.Join(args, " "), kpGuard, serverLog())
	}

	// kubectl exec fleetlearn-server-0 -- fleetlearn task list, with the
	// container's environment.
	cli := exec.Command(filepath.Join(dir, "fleetlearn"), "task", "list")
	cli.Env = []string{"HOME=" + t.TempDir(), "FLEETLEARN_SERVER=" + grpcAddr}
	for _, k := range []string{"FLEETLEARN_CA", "FLEETLEARN_TOKEN_FILE"} {
		cli.Env = append(cli.Env, k+"="+filepath.Join(root, prog.env[k]))
	}
	if b, err := cli.CombinedOutput(); err != nil {
		t.Errorf("fleetlearn task list with the container's environment: %v\n%s", err, b)
	}
}

// freeLoopbackPort is a TCP port free on 127.0.0.1 a moment ago.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	return freeport.Must(t)
}

// TestKubernetesPoolExecutorRuns runs the pool-executor overlay's
// fleetlearn-server command line against an API server in this process
// that allows only what the overlay's RBAC grants the server's service
// account, twice: first with no Kueue objects (the server reads and
// creates the flavors and the default tenant's queues, then lists and
// watches the JobSets), then with every object's spec replaced (it
// reads and updates them). Each call must be granted, and each grant on the
// queues and each JobSet read the start needs must be used. The JobSet
// writes of a running job (create, get, delete) are left to the table.
// As in TestKubernetesExternalNATSRuns only what a pod has and this
// machine lacks is moved: paths into a temporary directory, listen ports
// to free ones on loopback, and --pool-kubernetes=in-cluster (the pod's
// service account) to a kubeconfig naming this API server.
func TestKubernetesPoolExecutorRuns(t *testing.T) {
	dir := bins(t)
	m := renderOverlay(t, "pool-executor")
	sts := m.set("fleetlearn-server")
	if sts == nil {
		t.Fatal("pool-executor renders no fleetlearn-server StatefulSet")
	}
	c := &sts.Spec.Template.Spec.Containers[0]
	prog := containerProgramOf(t, m, sts, c)
	f, err := parseFlagArgs(prog.argv[1:])
	if err != nil || f["pool-kubernetes"] != "in-cluster" {
		t.Fatalf("pool-executor: %s/%s: want --pool-kubernetes=in-cluster (%v)", sts.Name, c.Name, err)
	}
	api := &fakeAPI{granted: m.grantsOf(t, sts.Namespace, sts.Spec.Template.Spec.ServiceAccountName), objects: map[string]map[string]any{}}
	hs := httptest.NewServer(api)
	defer hs.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: pool, cluster: {server: %q}}]
users: [{name: fleetlearn-server, user: {token: service-account-token}}]
contexts: [{name: pool, context: {cluster: pool, user: fleetlearn-server}}]
current-context: pool
`, hs.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "pod")
	mirrorPod(t, root, m, sts, c, nil)
	var args []string
	for _, a := range prog.argv[1:] {
		name, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		switch name {
		case "data-dir", "pool-kube-checkpoint-dir":
			v = filepath.Join(root, v)
		case "grpc-addr", "metrics-addr", "nats-listen":
			v = net.JoinHostPort("127.0.0.1", strconv.Itoa(freeLoopbackPort(t)))
		case "pool-kubernetes":
			v = kubeconfig
		}
		args = append(args, "--"+name+"="+v)
	}

	ns, _ := f.get("pool-kube-namespace", defaultPoolNamespace)
	startup := map[grant]bool{
		{ns, "jobset.x-k8s.io", "jobsets", "list"}:  true,
		{ns, "jobset.x-k8s.io", "jobsets", "watch"}: true,
	}
	perJob := map[string]bool{}
	for _, a := range poolExecutorAccess {
		perJob[a.resource] = a.perJob
	}
	for g := range requiredGrants(f) {
		if g.group == "kueue.x-k8s.io" && !perJob[g.resource] {
			startup[g] = true
		}
	}
	used := map[grant]bool{}
	for run, stale := range []bool{false, true} {
		if stale {
			api.staleSpecs()
		}
		api.reset()
		logFile := filepath.Join(t.TempDir(), "fleetlearn-server.log")
		out, err := os.Create(logFile)
		if err != nil {
			t.Fatal(err)
		}
		srv := exec.Command(filepath.Join(dir, "fleetlearn-server"), args...)
		srv.Env, srv.Stdout, srv.Stderr = []string{"HOME=" + t.TempDir()}, out, out
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- srv.Wait() }()
		serverLog := func() string { b, _ := os.ReadFile(logFile); return kpTail(string(b), 4000) }
		// Watching the JobSets is the executor's last step of the start.
		// A refused call ends the wait: the server retries it for ever.
		watching, refused := false, false
		for start := time.Now(); !watching && !refused && time.Since(start) < kpGuard; {
			select {
			case err := <-exited:
				out.Close()
				t.Fatalf("run %d: fleetlearn-server exited: %v; API calls %v\n%s", run, err, api.log(), serverLog())
			case <-time.After(100 * time.Millisecond):
			}
			watching = api.saw(grant{ns, "jobset.x-k8s.io", "jobsets", "watch"})
			_, denied := api.result()
			refused = len(denied) > 0
		}
		_ = srv.Process.Signal(os.Interrupt)
		<-exited
		out.Close()
		calls, denied := api.result()
		if len(denied) > 0 {
			t.Fatalf("run %d: the overlay's RBAC refuses the server %v; API calls %v\n%s", run, denied, api.log(), serverLog())
		}
		if !watching {
			t.Fatalf("run %d: fleetlearn-server did not watch the JobSets within %v; API calls %v\n%s", run, kpGuard, api.log(), serverLog())
		}
		maps.Copy(used, calls)
	}
	for g := range startup {
		if !used[g] {
			t.Errorf("the start never called %s, which the table says the executor needs", g)
		}
	}
}

// fakeAPI is the part of a Kubernetes API server the dynamic client of
// the pool executor reaches at start: get, create and update of single
// objects, list and watch of collections, each authorized against granted.
type fakeAPI struct {
	granted map[grant]bool
	mu      sync.Mutex
	objects map[string]map[string]any // by item path
	calls   map[grant]bool
	denied  []string
	seq     int
}

// apiPath is /apis/GROUP/VERSION[/namespaces/NS]/RESOURCE[/NAME].
var apiPath = regexp.MustCompile(`^/apis/([^/]+)/([^/]+)(?:/namespaces/([^/]+))?/([^/]+)(?:/([^/]+))?$`)

func (a *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := apiPath.FindStringSubmatch(r.URL.Path)
	if p == nil {
		a.status(w, http.StatusNotFound, "NotFound", "no such path "+r.URL.Path)
		return
	}
	group, version, ns, resource, name := p[1], p[2], p[3], p[4], p[5]
	verb := map[string]string{http.MethodGet: "get", http.MethodPost: "create", http.MethodPut: "update",
		http.MethodDelete: "delete", http.MethodPatch: "patch"}[r.Method]
	watching := r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1"
	if verb == "get" && name == "" {
		verb = "list"
		if watching {
			verb = "watch"
		}
	}
	g := grant{ns, group, resource, verb}
	a.mu.Lock()
	if !a.granted[g] {
		a.denied = append(a.denied, g.String())
		a.mu.Unlock()
		a.status(w, http.StatusForbidden, "Forbidden", "not granted: "+g.String())
		return
	}
	a.calls[g] = true
	item := strings.TrimSuffix(r.URL.Path, "/"+name)
	a.mu.Unlock()
	if verb == "watch" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch verb {
	case "get":
		obj, ok := a.objects[r.URL.Path]
		if !ok {
			a.status(w, http.StatusNotFound, "NotFound", resource+" "+name+" not found")
			return
		}
		writeJSON(w, http.StatusOK, obj)
	case "list":
		items := []any{}
		for k, o := range a.objects {
			if path.Dir(k) == item || path.Dir(k) == r.URL.Path {
				items = append(items, o)
			}
		}
		a.seq++
		writeJSON(w, http.StatusOK, map[string]any{"apiVersion": group + "/" + version, "kind": "List",
			"metadata": map[string]any{"resourceVersion": strconv.Itoa(a.seq)}, "items": items})
	case "create", "update":
		var obj map[string]any
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&obj); err != nil {
			a.status(w, http.StatusBadRequest, "BadRequest", err.Error())
			return
		}
		meta, _ := obj["metadata"].(map[string]any)
		objName, _ := meta["name"].(string)
		at := r.URL.Path
		if verb == "create" {
			at = r.URL.Path + "/" + objName
			if _, ok := a.objects[at]; ok {
				a.status(w, http.StatusConflict, "AlreadyExists", resource+" "+objName+" already exists")
				return
			}
		} else if _, ok := a.objects[at]; !ok || objName != name {
			a.status(w, http.StatusNotFound, "NotFound", resource+" "+name+" not found")
			return
		}
		a.seq++
		meta["resourceVersion"] = strconv.Itoa(a.seq)
		a.objects[at] = obj
		writeJSON(w, map[bool]int{true: http.StatusCreated, false: http.StatusOK}[verb == "create"], obj)
	default:
		a.status(w, http.StatusMethodNotAllowed, "MethodNotAllowed", verb+" is not served here")
	}
}

func (a *fakeAPI) status(w http.ResponseWriter, code int, reason, msg string) {
	writeJSON(w, code, map[string]any{"apiVersion": "v1", "kind": "Status", "status": "Failure",
		"code": code, "reason": reason, "message": msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// reset forgets the calls seen so far.
func (a *fakeAPI) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls, a.denied = map[grant]bool{}, nil
}

// staleSpecs replaces every stored object's spec with one the server
// never writes, so that the next start must update it.
func (a *fakeAPI) staleSpecs() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, o := range a.objects {
		o["spec"] = map[string]any{"stale": true}
	}
}

func (a *fakeAPI) saw(g grant) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[g]
}

func (a *fakeAPI) result() (map[grant]bool, []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.calls), slices.Clone(a.denied)
}

func (a *fakeAPI) log() []string {
	calls, denied := a.result()
	var l []string
	for g := range calls {
		l = append(l, g.String())
	}
	slices.Sort(l)
	return append(l, denied...)
}
