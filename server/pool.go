package server

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool"
	"github.com/fleetlearn/fleetlearn/pool/carbon"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/blobs"
	"github.com/fleetlearn/fleetlearn/server/internal/carbonhttp"
	"github.com/fleetlearn/fleetlearn/server/internal/kube"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
	"github.com/fleetlearn/fleetlearn/server/internal/poolsvc"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// poolActor names the compute pool's job service in the audit log.
var poolActor = audit.Service("pool")

// carbonSource is where the pool reads forecasts: a provider URL
// (carbonhttp: https, or http on loopback) or a file; nil without one.
func carbonSource(where string) (carbon.Source, error) {
	switch {
	case where == "":
		return nil, nil
	case strings.HasPrefix(where, "https://") || strings.HasPrefix(where, "http://"):
		src, err := carbonhttp.New(where, os.Getenv(CarbonTokenEnv), nil)
		if err != nil {
			return nil, fmt.Errorf("server: --carbon-forecast: %w", err)
		}
		return src, nil
	}
	return carbon.FileSource{Path: where}, nil
}

// CarbonTokenEnv holds the bearer token for a forecast provider URL: in the
// environment, not on the command line, where other users could read it.
const CarbonTokenEnv = "FLEETLEARN_CARBON_TOKEN"

// PoolCheckpointDir is where a server with data directory dataDir keeps
// pool jobs' checkpoints.
func PoolCheckpointDir(dataDir string) string { return filepath.Join(dataDir, "pool", "checkpoints") }

// startPool starts the compute pool's job service; its state is in the
// store, its checkpoints under PoolCheckpointDir.
func (s *Server) startPool(ctx context.Context, st *store.Store, bl *blobs.Store, mx *metrics.M) error {
	src, err := carbonSource(s.cfg.CarbonForecast)
	if err != nil {
		return err
	}
	v := &service{s: s, blobs: bl}
	kx, err := s.kubeExecutor(ctx)
	if err != nil {
		return err
	}
	svc, err := poolsvc.New(poolsvc.Deps{Store: st, Clock: s.o.clock, Log: s.o.log.With("component", "pool"),
		CheckpointDir: PoolCheckpointDir(s.cfg.DataDir),
		Audit: func(ctx context.Context, ps ...audit.Payload) error {
			return s.recordBatch(ctx, poolActor, ps...)
		},
		StoreModel: func(ctx context.Context, name string, m *model.Model, lin *pb.PoolLineage) (*pb.Model, error) {
			return v.storePoolModel(ctx, name, m, lin)
		},
		CreateTask: func(ctx context.Context, t *pb.Task) (*pb.Task, error) {
			created, _, err := v.CreateTask(ctx, t)
			return created, err
		},
		Tenants: s.cfg.PoolTenants, HeartbeatInterval: s.cfg.PoolHeartbeat, HeartbeatsToLoss: s.cfg.PoolHeartbeatsToLoss,
		MaxWorkersPerPrincipal: s.cfg.PoolMaxWorkersPerToken,
		Carbon:                 src, Kube: kx, KubeCheckpointDir: s.cfg.PoolKube.CheckpointDir, Metrics: mx})
	if err != nil {
		return fmt.Errorf("server: pool: %w", err)
	}
	if err := svc.Start(ctx); err != nil {
		return fmt.Errorf("server: pool: %w", err)
	}
	s.pool = svc
	return nil
}

// kubeExecutor connects the Kubernetes executor, and creates the tenants'
// queues when the server is given the capacity; nil without a cluster.
func (s *Server) kubeExecutor(ctx context.Context) (poolsvc.KubeExecutor, error) {
	k := s.cfg.PoolKube
	if k.Cluster == "" {
		return nil, nil
	}
	if k.Namespace == "" {
		k.Namespace = DefaultPoolKubeNamespace
	}
	var rc *rest.Config
	var err error
	if k.Cluster == "in-cluster" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", k.Cluster)
	}
	if err != nil {
		return nil, fmt.Errorf("server: --pool-kubernetes %s: %w", k.Cluster, err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("server: --pool-kubernetes %s: %w", k.Cluster, err)
	}
	ctl, err := kube.NewController(dyn, kube.Config{Namespace: k.Namespace, Image: k.Image, CheckpointClaim: k.CheckpointClaim,
		ServiceAccount: k.ServiceAccount, RetryableExitCodes: k.RetryableExitCodes}, kube.WithLogger(s.o.log.With("component", "kube")), kube.WithClock(s.o.clock))
	if err != nil {
		return nil, fmt.Errorf("server: --pool-kubernetes: %w", err)
	}
	if k.Capacity != (pool.Resources{}) {
		tenants := s.cfg.PoolTenants
		if len(tenants) == 0 {
			tenants = map[string]pool.Tenant{poolsvc.DefaultTenant: {Weight: 1}}
		}
		if err := ctl.EnsureQueues(ctx, tenants, kube.QueueConfig{Namespace: k.Namespace, Capacity: k.Capacity}); err != nil {
			return nil, fmt.Errorf("server: --pool-kubernetes: creating the tenants' Kueue queues: %w", err)
		}
	}
	return ctl, nil
}

// storePoolModel stores a pool job's model as a version of family name,
// in the canonical safetensors encoding, with its lineage.
func (v *service) storePoolModel(ctx context.Context, name string, m *model.Model, lin *pb.PoolLineage) (*pb.Model, error) {
	c := &model.Model{Tensors: m.Tensors, Lineage: model.Lineage{Job: lin.GetJobId(), Source: "pool"}}
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, c); err != nil {
		return nil, fmt.Errorf("server: pool model: %w", err)
	}
	version, err := v.blobs.Put(ctx, buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("server: pool model: %w", err)
	}
	row := &store.ModelRow{Version: version, Name: name, Description: "trained by pool job " + lin.GetJobId(),
		Source: pb.ModelSource_MODEL_SOURCE_POOL, Tensors: len(c.Tensors), Params: len(c.Flatten()),
		Size: int64(buf.Len()), Created: v.s.o.now(), Lineage: lin}
	if err := v.s.store.InsertModel(ctx, row); err != nil {
		return nil, fmt.Errorf("server: pool model: %w", err)
	}
	return row.Proto(), nil
}
