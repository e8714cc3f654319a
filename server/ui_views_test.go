package server_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestDashboardShowsWhatIsTrue: on a fleet of two agents holding 2770 and
// 1834 examples, and a task of 2 rounds that paused after 3 rounds no
// device could join, the API and the dashboard give each device's
// examples, the task's progress as 0 of 2 trained with 3 abandoned (not
// "round 3 of 2"), and what a viewer's role may not see in words, with the
// role that may.
func TestDashboardShowsWhatIsTrue(t *testing.T) {
	h := servertest.New(t, servertest.WithPace(50*time.Millisecond),
		servertest.WithConfig(func(c *server.Config) { c.UIAddr = "127.0.0.1:0" }))
	examples := map[string]uint64{"dev-000": 2770, "dev-001": 1834}
	startFleet(t, h, 2, func(i int) *data.Dataset { return datatest.Synthetic([]int{2770, 1834}[i], 8, 3, uint64(i+1)) })

	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "paused", init)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	task := baseTask("paused", version, module, 2)
	task.CohortTarget, task.OverSelection, task.ReportGoal = 2, 0, 2
	// Neither agent holds enough examples to take a seat: every round
	// closes its selection empty.
	task.Eligibility = &pb.Eligibility{MinExamples: 5000}
	task.SelectionTimeout, task.ReportTimeout = durationpb.New(20*time.Millisecond), durationpb.New(20*time.Millisecond)
	id := h.CreateTask(t, task).GetId()
	paused := h.WaitTask(t, id, time.Minute, pb.TaskState_TASK_STATE_PAUSED)
	if paused.GetCurrentRound() != 3 {
		t.Fatalf("paused at round %d, want 3", paused.GetCurrentRound())
	}

	// The agents' check-ins are written off the check-in path: wait until
	// the registry has seen both.
	for {
		devs, err := h.Devices.ListDevices(t.Context(), &pb.ListDevicesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, d := range devs.GetDevices() {
			if d.GetLastSeenTime() != nil {
				seen++
			}
		}
		if seen == len(examples) {
			for _, d := range devs.GetDevices() {
				if got := d.GetAttributes().GetExamplesAvailable(); got != examples[d.GetId()] {
					t.Errorf("ListDevices: %s has %d examples, want %d", d.GetId(), got, examples[d.GetId()])
				}
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	operator, err := h.MintToken("olga", []identity.Role{identity.RoleOperator}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	auditor, err := h.MintToken("ada", []identity.Role{identity.RoleAuditor}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := &dashboardFixture{h: h, url: h.UIURL()}
	b := newBrowser(t, f)
	b.login(operator)

	t.Run("fleet page shows each device's examples", func(t *testing.T) {
		code, body := b.get("/devices")
		if code != http.StatusOK {
			t.Fatalf("fleet page: %d\n%s", code, body)
		}
		for dev, n := range examples {
			row := tableRow(body, `data-device="`+dev+`"`)
			if !strings.Contains(row, "<td>"+strconv.FormatUint(n, 10)+"</td>") {
				t.Errorf("fleet page: the row of %s does not show %d examples:\n%s", dev, n, row)
			}
		}
	})

	t.Run("progress counts committed training rounds", func(t *testing.T) {
		code, body := b.get("/")
		if code != http.StatusOK {
			t.Fatalf("overview: %d\n%s", code, body)
		}
		row := tableRow(body, `data-task="`+id+`"`)
		if strings.Contains(row, "3 of 2") || !strings.Contains(row, `class="trained" data-value="0"`) ||
			!strings.Contains(row, "0 of 2 rounds") || !strings.Contains(row, `class="abandoned" data-value="3"`) {
			t.Errorf("overview's row of the paused task:\n%s", row)
		}
		code, body = b.get("/tasks/" + id)
		if code != http.StatusOK {
			t.Fatalf("task page: %d\n%s", code, body)
		}
		if strings.Contains(body, "3 of 2") || !strings.Contains(body, `id="task-trained" data-value="0">0 of 2 training rounds`) ||
			!strings.Contains(body, `id="task-abandoned" data-value="3"`) {
			t.Errorf("task page of the paused task:\n%s", body)
		}
	})

	t.Run("a refusal names what and which role", func(t *testing.T) {
		want := "reading the audit log&#39;s entries needs the admin or auditor role; your token has the operator role"
		for _, page := range []string{"/audit", "/tasks/" + id + "/rounds/1"} {
			code, body := b.get(page)
			if code != http.StatusOK || strings.Contains(body, "/fleetlearn.api.v1.") || !strings.Contains(body, want) {
				t.Errorf("operator's %s: %d\n%s", page, code, body)
			}
		}
		ab := newBrowser(t, f)
		ab.login(auditor)
		_, page := ab.get("/devices")
		m := csrfField.FindStringSubmatch(page)
		if m == nil {
			t.Fatal("no form token on the auditor's fleet page")
		}
		resp, body := ab.do("POST", "/devices/dev-000/revoke", url.Values{"csrf": {m[1]}}, nil)
		if resp.StatusCode != http.StatusForbidden || strings.Contains(body, "/fleetlearn.api.v1.") ||
			!strings.Contains(body, "revoking devices needs the admin or operator role; your token has the auditor role") {
			t.Errorf("auditor's revoke: %d\n%s", resp.StatusCode, body)
		}
	})
}

// tableRow is the table row of page whose <tr> carries attr.
func tableRow(page, attr string) string {
	return regexp.MustCompile(`(?s)<tr ` + regexp.QuoteMeta(attr) + `>.*?</tr>`).FindString(page)
}
