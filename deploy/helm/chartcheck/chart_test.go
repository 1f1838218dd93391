// Package chartcheck renders kedge's Helm chart (deploy/helm/kedge) with Helm's own library,
// as 'helm template' does, for the default and for non-default values, and decodes every
// object strictly into the Kubernetes API types (an unknown or misplaced field is an error),
// then checks what the chart promises: hostNetwork, the capabilities of the enabled features
// and no others, probes, mounts, a config the agent accepts, the optional ServiceMonitor.
// It also keeps deploy/kubernetes/kedge.yaml, the rendered plain manifest, identical to what
// the chart renders (KEDGE_UPDATE_GOLDEN=1 rewrites it).
//
// A module of its own, so that Helm and the Kubernetes libraries are no dependency of kedge.
package chartcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kedge-dev/kedge/internal/agent"
)

const (
	chartDir     = "../kedge"
	manifestPath = "../../kubernetes/kedge.yaml"
	// The plain manifest is the chart rendered as release "kedge" in kube-system (where
	// priority class system-node-critical is allowed), under this header.
	manifestHeader = `# kedge node agent: deploy/helm/kedge rendered with its default values as release "kedge" in
# namespace kube-system. Generated - do not edit: change the chart, then run
#   KEDGE_UPDATE_GOLDEN=1 go test ./deploy/helm/chartcheck   (from deploy/helm/chartcheck: go test .)
# Apply with: kubectl apply -f deploy/kubernetes/kedge.yaml (docs/deploy.md).
`
)

// render renders the chart as 'helm template NAME deploy/helm/kedge -n NS' would.
func render(t *testing.T, name, ns string, values map[string]any) string {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	inst := action.NewInstall(&action.Configuration{})
	inst.DryRun, inst.ClientOnly, inst.Replace, inst.IncludeCRDs = true, true, true, true
	inst.ReleaseName, inst.Namespace = name, ns
	inst.KubeVersion = &chartutil.KubeVersion{Version: "v1.32.0", Major: "1", Minor: "32"}
	rel, err := inst.Run(ch, values)
	if err != nil {
		t.Fatalf("render chart: %v", err)
	}
	return rel.Manifest
}

// objects decodes every document of a manifest strictly into its API type.
type objects struct {
	ds   *appsv1.DaemonSet
	cm   *corev1.ConfigMap
	sa   *corev1.ServiceAccount
	svc  *corev1.Service
	smon *monitoringv1.ServiceMonitor
}

func decode(t *testing.T, manifest string) objects {
	t.Helper()
	var o objects
	for _, doc := range strings.Split(manifest, "\n---") {
		body := strings.TrimSpace(doc)
		content := 0
		for _, line := range strings.Split(body, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") && strings.Trim(l, "-") != "" {
				content++
			}
		}
		if content == 0 {
			continue // comments only (the plain manifest's header)
		}
		js, err := yaml.YAMLToJSON([]byte(body))
		if err != nil {
			t.Fatalf("yaml: %v\n%s", err, body)
		}
		var meta struct{ APIVersion, Kind string }
		if err := json.Unmarshal(js, &meta); err != nil || meta.Kind == "" {
			t.Fatalf("no kind: %v\n%s", err, body)
		}
		var into any
		switch meta.APIVersion + "/" + meta.Kind {
		case "apps/v1/DaemonSet":
			o.ds = &appsv1.DaemonSet{}
			into = o.ds
		case "v1/ConfigMap":
			o.cm = &corev1.ConfigMap{}
			into = o.cm
		case "v1/ServiceAccount":
			o.sa = &corev1.ServiceAccount{}
			into = o.sa
		case "v1/Service":
			o.svc = &corev1.Service{}
			into = o.svc
		case "monitoring.coreos.com/v1/ServiceMonitor":
			o.smon = &monitoringv1.ServiceMonitor{}
			into = o.smon
		default:
			t.Fatalf("unexpected object %s %s", meta.APIVersion, meta.Kind)
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(into); err != nil {
			t.Fatalf("%s does not decode strictly into its API type: %v\n%s", meta.Kind, err, body)
		}
	}
	if o.ds == nil || o.cm == nil || o.sa == nil {
		t.Fatalf("missing DaemonSet, ConfigMap or ServiceAccount:\n%s", manifest)
	}
	return o
}

func TestLint(t *testing.T) {
	lint := action.NewLint()
	lint.Strict = true
	for _, vals := range []map[string]any{nil, nonDefault()} {
		res := lint.Run([]string{chartDir}, vals)
		for _, m := range res.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint: %s", m)
			}
		}
		for _, err := range res.Errors {
			t.Errorf("helm lint: %v", err)
		}
	}
}

// nonDefault turns every knob: hedging off, a hedger in a named namespace, another port,
// a ServiceMonitor, no Service of its own, another image and name, resources, scheduling.
func nonDefault() map[string]any {
	return map[string]any{
		"fullnameOverride": "edge-agent",
		"image":            map[string]any{"repository": "registry.example/kedge", "tag": "abc123", "pullPolicy": "Always"},
		"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
		"features":         map[string]any{"hedge": false, "pping": true, "namespaces": true},
		"config": map[string]any{
			"log":   map[string]any{"level": "debug", "format": "text"},
			"hedge": []any{},
			"pping": []any{map[string]any{"interface": "eth1", "netns": "blue", "aggregate": "5s", "prefix_v4": 16}},
		},
		"metricsPort":       9500,
		"resources":         map[string]any{"requests": map[string]any{"cpu": "10m", "memory": "32Mi"}, "limits": map[string]any{"cpu": "1", "memory": "128Mi"}},
		"tolerations":       []any{map[string]any{"key": "edge", "operator": "Equal", "value": "true", "effect": "NoSchedule"}},
		"nodeSelector":      map[string]any{"kedge.dev/agent": "yes"},
		"priorityClassName": "",
		"hostPID":           true,
		"service":           map[string]any{"enabled": false},
		"serviceMonitor":    map[string]any{"enabled": true, "interval": "15s", "labels": map[string]any{"release": "prom"}},
		"podAnnotations":    map[string]any{"team": "sre"},
		"seccompProfile":    map[string]any{"type": "Unconfined"},
	}
}

func TestRenderDefault(t *testing.T) {
	o := decode(t, render(t, "kedge", "kube-system", nil))
	spec := o.ds.Spec.Template.Spec
	c := spec.Containers[0]
	checkCommon(t, o, "kedge", 9464)
	if got := caps(c); !slices.Equal(got, []string{"BPF", "NET_ADMIN", "NET_RAW", "PERFMON", "SYS_ADMIN"}) {
		t.Errorf("capabilities %v, want hedging's (BPF NET_ADMIN NET_RAW PERFMON SYS_ADMIN)", got)
	}
	if spec.PriorityClassName != "system-node-critical" || spec.HostPID || len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Errorf("scheduling: priority %q hostPID %v tolerations %v", spec.PriorityClassName, spec.HostPID, spec.Tolerations)
	}
	if c.SecurityContext.AppArmorProfile == nil || c.SecurityContext.AppArmorProfile.Type != corev1.AppArmorProfileTypeUnconfined {
		t.Errorf("AppArmor: %v, want Unconfined while hedging", c.SecurityContext.AppArmorProfile)
	}
	if o.svc == nil || o.smon != nil {
		t.Errorf("default: want the headless Service and no ServiceMonitor")
	}
	if c.Image != "localhost/kedge:latest" {
		t.Errorf("image %s", c.Image)
	}
}

func TestRenderNonDefault(t *testing.T) {
	o := decode(t, render(t, "edge", "monitoring", nonDefault()))
	spec := o.ds.Spec.Template.Spec
	c := spec.Containers[0]
	checkCommon(t, o, "edge-agent", 9500)
	if got := caps(c); !slices.Equal(got, []string{"BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN"}) {
		t.Errorf("capabilities %v, want pping's with namespaces (BPF NET_ADMIN PERFMON SYS_ADMIN)", got)
	}
	if c.SecurityContext.AppArmorProfile != nil {
		t.Errorf("AppArmor %v without hedging, want the runtime's default", c.SecurityContext.AppArmorProfile)
	}
	if c.Image != "registry.example/kedge:abc123" || c.ImagePullPolicy != corev1.PullAlways || spec.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("image %s %s %v", c.Image, c.ImagePullPolicy, spec.ImagePullSecrets)
	}
	if spec.PriorityClassName != "" || !spec.HostPID || spec.NodeSelector["kedge.dev/agent"] != "yes" || spec.Tolerations[0].Key != "edge" {
		t.Errorf("scheduling: priority %q hostPID %v nodeSelector %v tolerations %v", spec.PriorityClassName, spec.HostPID, spec.NodeSelector, spec.Tolerations)
	}
	if got := c.Resources.Limits.Memory().String(); got != "128Mi" || c.Resources.Limits.Cpu().String() != "1" || c.Resources.Requests.Cpu().String() != "10m" {
		t.Errorf("limits %v", c.Resources.Limits)
	}
	if o.svc == nil {
		t.Fatal("a ServiceMonitor needs the Service (kept even with service.enabled false)")
	}
	if o.smon == nil {
		t.Fatal("no ServiceMonitor with serviceMonitor.enabled")
	}
	ep := o.smon.Spec.Endpoints[0]
	if ep.Port != "metrics" || string(ep.Interval) != "15s" || o.smon.Labels["release"] != "prom" ||
		o.smon.Spec.Selector.MatchLabels["app.kubernetes.io/instance"] != "edge" || o.smon.Namespace != "monitoring" {
		t.Errorf("ServiceMonitor %+v", o.smon)
	}
	if o.ds.Spec.Template.Annotations["team"] != "sre" {
		t.Errorf("pod annotations %v", o.ds.Spec.Template.Annotations)
	}
}

// checkCommon checks what every rendering must hold.
func checkCommon(t *testing.T, o objects, name string, port int32) {
	t.Helper()
	spec := o.ds.Spec.Template.Spec
	if o.ds.Name != name || o.cm.Name != name {
		t.Errorf("names %s %s, want %s", o.ds.Name, o.cm.Name, name)
	}
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet || *spec.AutomountServiceAccountToken {
		t.Errorf("hostNetwork %v dnsPolicy %s automount %v", spec.HostNetwork, spec.DNSPolicy, *spec.AutomountServiceAccountToken)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || *sc.Privileged || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem || *sc.RunAsUser != 0 ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("securityContext %+v: want unprivileged, no escalation, read-only root, all capabilities dropped first", sc)
	}
	if c.Ports[0].ContainerPort != port || c.Ports[0].Name != "metrics" {
		t.Errorf("ports %v", c.Ports)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "metrics" {
		t.Errorf("liveness probe %+v", p)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.String() != "metrics" {
		t.Errorf("readiness probe %+v", p)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want requests and a memory limit", c.Resources)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	for path, vol := range map[string]string{"/run/kedge": "run-kedge", "/run/netns": "run-netns", "/sys/fs/bpf": "bpffs"} {
		if m, ok := mounts[path]; !ok || m.Name != vol || hostPaths[vol] != path {
			t.Errorf("%s: mount %+v, host path %q", path, m, hostPaths[vol])
		}
	}
	if m := mounts["/etc/kedge"]; !m.ReadOnly {
		t.Errorf("config mount %+v", m)
	}
	// The config the agent reads: valid, listening on the probes' port.
	cfg, err := agent.Parse("ConfigMap "+o.cm.Name, []byte(o.cm.Data["kedge.yaml"]))
	if err != nil {
		t.Fatalf("the ConfigMap's kedge.yaml: %v\n%s", err, o.cm.Data["kedge.yaml"])
	}
	if cfg.Listen != fmt.Sprintf(":%d", port) {
		t.Errorf("config listen %q, want :%d", cfg.Listen, port)
	}
	if o.svc != nil && (o.svc.Spec.ClusterIP != "None" || o.svc.Spec.Ports[0].Port != port) {
		t.Errorf("Service %+v", o.svc.Spec)
	}
}

func caps(c corev1.Container) []string {
	var out []string
	for _, cp := range c.SecurityContext.Capabilities.Add {
		out = append(out, string(cp))
	}
	slices.Sort(out)
	return out
}

// TestPlainManifest keeps deploy/kubernetes/kedge.yaml the chart's default rendering.
func TestPlainManifest(t *testing.T) {
	want := manifestHeader + render(t, "kedge", "kube-system", nil)
	if os.Getenv("KEDGE_UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll(filepath.Dir(manifestPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(manifestPath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatalf("%v (KEDGE_UPDATE_GOLDEN=1 writes it)", err)
	}
	if string(got) != want {
		t.Errorf("%s differs from the chart's rendering: run KEDGE_UPDATE_GOLDEN=1 go test in deploy/helm/chartcheck and commit it", manifestPath)
	}
	decode(t, string(got))
}
