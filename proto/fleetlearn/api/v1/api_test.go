package apiv1_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
)

const (
	pkg protoreflect.FullName = "fleetlearn.api.v1"
	// msgs holds the services' request and response messages.
	msgs protoreflect.FullName = "fleetlearn.v1"
)

type method struct {
	name         protoreflect.Name
	clientStream bool
	serverStream bool
}

// TestServices pins every service's methods, their streaming and their message
// names: they are the API's contract with deployed clients.
func TestServices(t *testing.T) {
	tests := []struct {
		service protoreflect.FullName
		methods []method
	}{
		{"fleetlearn.api.v1.TaskService", []method{
			{name: "CreateTask"},
			{name: "GetTask"},
			{name: "ListTasks"},
			{name: "StopTask"},
			{name: "ResumeTask"},
			{name: "WatchTask", serverStream: true},
			{name: "ListRounds"},
		}},
		{"fleetlearn.api.v1.ModelService", []method{
			{name: "ImportModel", clientStream: true},
			{name: "ExportModel", serverStream: true},
			{name: "GetModel"},
			{name: "ListModels"},
		}},
		{"fleetlearn.api.v1.ModuleService", []method{
			{name: "RegisterModule", clientStream: true},
			{name: "GetModule"},
			{name: "ListModules"},
		}},
		{"fleetlearn.api.v1.AuditService", []method{
			{name: "QueryEntries"},
			{name: "GetCheckpoint"},
			{name: "GetInclusionProof"},
			{name: "GetConsistencyProof"},
			{name: "ExportEntries", serverStream: true},
			{name: "GetPublicKeys"},
			{name: "AddCosignature"},
		}},
		{"fleetlearn.api.v1.DeviceService", []method{
			{name: "CreateEnrollmentToken"},
			{name: "ListDevices"},
			{name: "RevokeDevice"},
		}},
		{"fleetlearn.api.v1.EnrollmentService", []method{
			{name: "Enroll"},
		}},
		{"fleetlearn.api.v1.NATSService", []method{
			{name: "IssueCredentials"},
		}},
		{"fleetlearn.api.v1.PoolService", []method{
			{name: "SubmitJob"},
			{name: "GetJob"},
			{name: "ListJobs"},
			{name: "CancelJob"},
			{name: "WatchJob", serverStream: true},
			{name: "JobLogs", serverStream: true},
			{name: "ListWorkers"},
		}},
		{"fleetlearn.api.v1.PoolWorkerService", []method{
			{name: "RegisterWorker"},
			{name: "Heartbeat"},
			{name: "RankExited"},
			{name: "PutCheckpointBlob"},
			{name: "HasCheckpointBlob"},
			{name: "GetCheckpointBlob"},
			{name: "CommitCheckpoint"},
			{name: "GetRankCheckpoint"},
			{name: "ListRankCheckpoints"},
			{name: "Average", clientStream: true, serverStream: true},
			{name: "OuterSync", clientStream: true, serverStream: true},
			{name: "AppendLogs"},
		}},
	}
	seen := map[protoreflect.FullName]bool{}
	for _, tt := range tests {
		t.Run(string(tt.service.Name()), func(t *testing.T) {
			seen[tt.service] = true
			d, err := protoregistry.GlobalFiles.FindDescriptorByName(tt.service)
			if err != nil {
				t.Fatalf("FindDescriptorByName: %v", err)
			}
			sd := d.(protoreflect.ServiceDescriptor)
			if got, want := sd.Methods().Len(), len(tt.methods); got != want {
				t.Errorf("%d methods, want %d", got, want)
			}
			for _, m := range tt.methods {
				md := sd.Methods().ByName(m.name)
				if md == nil {
					t.Errorf("missing method %s", m.name)
					continue
				}
				if md.IsStreamingClient() != m.clientStream || md.IsStreamingServer() != m.serverStream {
					t.Errorf("%s streaming (client, server) = (%v, %v), want (%v, %v)",
						m.name, md.IsStreamingClient(), md.IsStreamingServer(), m.clientStream, m.serverStream)
				}
				if got, want := md.Input().FullName(), msgs.Append(m.name+"Request"); got != want {
					t.Errorf("%s input = %s, want %s", m.name, got, want)
				}
				if got, want := md.Output().FullName(), msgs.Append(m.name+"Response"); got != want {
					t.Errorf("%s output = %s, want %s", m.name, got, want)
				}
			}
		})
	}

	// Every service in the package must be covered above.
	protoregistry.GlobalFiles.RangeFilesByPackage(pkg, func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			if name := fd.Services().Get(i).FullName(); !seen[name] {
				t.Errorf("service %s is not covered by TestServices", name)
			}
		}
		return true
	})
}

// TestGRPCServiceDescs checks that the generated gRPC registration tables
// agree with the descriptors the servers will advertise via reflection.
func TestGRPCServiceDescs(t *testing.T) {
	for _, sd := range []struct {
		name      string
		unary     []string
		streaming []string
	}{
		{apiv1.TaskService_ServiceDesc.ServiceName, methodNames(apiv1.TaskService_ServiceDesc.Methods), streamNames(apiv1.TaskService_ServiceDesc.Streams)},
		{apiv1.ModelService_ServiceDesc.ServiceName, methodNames(apiv1.ModelService_ServiceDesc.Methods), streamNames(apiv1.ModelService_ServiceDesc.Streams)},
		{apiv1.ModuleService_ServiceDesc.ServiceName, methodNames(apiv1.ModuleService_ServiceDesc.Methods), streamNames(apiv1.ModuleService_ServiceDesc.Streams)},
		{apiv1.AuditService_ServiceDesc.ServiceName, methodNames(apiv1.AuditService_ServiceDesc.Methods), streamNames(apiv1.AuditService_ServiceDesc.Streams)},
		{apiv1.DeviceService_ServiceDesc.ServiceName, methodNames(apiv1.DeviceService_ServiceDesc.Methods), streamNames(apiv1.DeviceService_ServiceDesc.Streams)},
		{apiv1.EnrollmentService_ServiceDesc.ServiceName, methodNames(apiv1.EnrollmentService_ServiceDesc.Methods), streamNames(apiv1.EnrollmentService_ServiceDesc.Streams)},
		{apiv1.NATSService_ServiceDesc.ServiceName, methodNames(apiv1.NATSService_ServiceDesc.Methods), streamNames(apiv1.NATSService_ServiceDesc.Streams)},
	} {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(sd.name))
		if err != nil {
			t.Errorf("%s: %v", sd.name, err)
			continue
		}
		methods := d.(protoreflect.ServiceDescriptor).Methods()
		if got, want := len(sd.unary)+len(sd.streaming), methods.Len(); got != want {
			t.Errorf("%s: gRPC desc has %d methods, descriptor %d", sd.name, got, want)
		}
		for _, n := range sd.unary {
			md := methods.ByName(protoreflect.Name(n))
			if md == nil || md.IsStreamingClient() || md.IsStreamingServer() {
				t.Errorf("%s: %s registered as unary but descriptor says %v", sd.name, n, md)
			}
		}
		for _, n := range sd.streaming {
			md := methods.ByName(protoreflect.Name(n))
			if md == nil || !(md.IsStreamingClient() || md.IsStreamingServer()) {
				t.Errorf("%s: %s registered as streaming but descriptor says %v", sd.name, n, md)
			}
		}
	}
}

func methodNames(ms []grpc.MethodDesc) []string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.MethodName
	}
	return names
}

func streamNames(ss []grpc.StreamDesc) []string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.StreamName
	}
	return names
}
