package data_test

import (
	"fmt"
	"log"
	"strings"

	"github.com/fleetlearn/fleetlearn/data"
)

func ExampleReadCSV() {
	const people = `user,age,plan,outcome
u1,31.5,basic,stay
u2,45,pro,leave
u1,32,basic,upgrade
`
	res, err := data.ReadCSV(strings.NewReader(people), "people.csv", data.CSVOptions{Label: "outcome", Key: "user"})
	if err != nil {
		log.Fatal(err)
	}
	d := res.Dataset
	fmt.Println(d.Len(), "rows of", d.Dim, "features:", d.Features)
	fmt.Println("classes", res.Classes, "labels", d.Labels)
	fmt.Println("keys", res.Keys, "skipped", res.Skipped)
	// Output:
	// 3 rows of 1 features: [31.5 45 32]
	// classes [leave stay upgrade] labels [1 0 2]
	// keys [u1 u2 u1] skipped [plan]
}
