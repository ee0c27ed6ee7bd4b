// A consumer of walbridge's change feed in Go: it subscribes as a durable
// consumer, prints each change as a JSON line (table, operation, id, the
// row decoded from the relation descriptions the feed sends), and
// acknowledges each transaction once printed, so a restart resumes after
// the last one printed and nothing is lost or printed twice.
//
//	go-consumer -address 127.0.0.1:7070 -consumer audit -start earliest
//
// Flags for TLS (-ca, -cert, -key) and a bearer token (-token-env NAME,
// the environment variable holding it) match the sink's settings.
// With -idle it stops after that long without a transaction.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	feedv1 "walbridge.example/go-consumer/feedv1"
)

func main() {
	address := flag.String("address", "127.0.0.1:7070", "the feed's host:port")
	consumer := flag.String("consumer", "", "durable consumer name (empty: ephemeral)")
	start := flag.String("start", "latest", "where a new consumer starts: earliest or latest")
	caFile := flag.String("ca", "", "CA certificate to verify the server with (TLS)")
	certFile := flag.String("cert", "", "client certificate (mutual TLS)")
	keyFile := flag.String("key", "", "client certificate's key")
	tokenEnv := flag.String("token-env", "", "environment variable holding the bearer token")
	idle := flag.Duration("idle", 0, "stop after this long without a transaction (0: never)")
	flag.Parse()

	conn, err := grpc.NewClient(*address, grpc.WithTransportCredentials(transport(*caFile, *certFile, *keyFile)))
	if err != nil {
		log.Fatalf("connect to %s: %v", *address, err)
	}
	defer conn.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if *tokenEnv != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+os.Getenv(*tokenEnv))
	}
	stream, err := feedv1.NewChangeFeedClient(conn).Subscribe(ctx)
	if err != nil {
		log.Fatalf("subscribe: %v", err)
	}
	open := &feedv1.Open{Consumer: *consumer, Start: startAt(*start)}
	if err := stream.Send(&feedv1.SubscribeRequest{Request: &feedv1.SubscribeRequest_Open{Open: open}}); err != nil {
		log.Fatalf("open: %v", err)
	}

	events := make(chan *feedv1.SubscribeResponse)
	failed := make(chan error, 1)
	go func() {
		for {
			event, err := stream.Recv()
			if err != nil {
				failed <- err
				return
			}
			events <- event
		}
	}()

	out := json.NewEncoder(os.Stdout)
	tables := map[uint32]*feedv1.RelationDescription{}
	var quiet <-chan time.Time
	if *idle > 0 {
		quiet = time.After(*idle)
	}
	for {
		select {
		case <-quiet:
			// Half-close: the server stores the last acknowledgement, then ends.
			if err := stream.CloseSend(); err != nil {
				log.Fatalf("close: %v", err)
			}
			quiet = nil
		case err := <-failed:
			if err == io.EOF {
				return
			}
			log.Fatalf("the feed ended: %v", err)
		case event := <-events:
			var token []byte
			switch e := event.Event.(type) {
			case *feedv1.SubscribeResponse_Relation:
				tables[e.Relation.Relation] = e.Relation
			case *feedv1.SubscribeResponse_Rows:
				for i, row := range e.Rows.Rows {
					id := e.Rows.FirstId
					emit(out, tables[e.Rows.Relation], "read", id.Source, id.Lsn, id.Sequence+uint64(i), row, nil)
				}
				token = e.Rows.ResumeToken
			case *feedv1.SubscribeResponse_Change:
				c := e.Change
				emit(out, tables[c.Relation], c.Operation.String(), c.Id.Source, c.Id.Lsn, c.Id.Sequence, c.New, c.Old)
			case *feedv1.SubscribeResponse_Commit:
				token = e.Commit.ResumeToken
			case *feedv1.SubscribeResponse_CopyComplete:
				token = e.CopyComplete.ResumeToken
			}
			if len(token) == 0 {
				continue
			}
			ack := &feedv1.SubscribeRequest{Request: &feedv1.SubscribeRequest_Ack{Ack: &feedv1.Ack{ResumeToken: token}}}
			if err := stream.Send(ack); err != nil && err != io.EOF {
				log.Fatalf("acknowledge: %v", err)
			}
			out.Encode(map[string]string{"acked": base64.StdEncoding.EncodeToString(token)})
			if *idle > 0 && quiet != nil {
				quiet = time.After(*idle)
			}
		}
	}
}

func transport(caFile, certFile, keyFile string) credentials.TransportCredentials {
	if caFile == "" {
		return insecure.NewCredentials()
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		log.Fatalf("read -ca: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		log.Fatalf("-ca %s holds no PEM certificate", caFile)
	}
	config := &tls.Config{RootCAs: roots}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			log.Fatalf("read -cert/-key: %v", err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(config)
}

func startAt(name string) *feedv1.Start {
	switch name {
	case "earliest":
		return &feedv1.Start{Position: &feedv1.Start_Earliest{Earliest: &feedv1.Earliest{}}}
	case "latest":
		return &feedv1.Start{Position: &feedv1.Start_Latest{Latest: &feedv1.Latest{}}}
	}
	log.Fatalf("-start %q: earliest or latest", name)
	return nil
}

// emit writes one change: its table, operation, id and rows by column name.
func emit(out *json.Encoder, table *feedv1.RelationDescription, operation, source, lsn string, sequence uint64, row, old *feedv1.Row) {
	line := map[string]any{"op": operation, "id": fmt.Sprintf("%s/%s/%d", source, lsn, sequence)}
	if table != nil {
		line["table"] = table.Schema + "." + table.Table
		if row != nil {
			line["new"] = columns(table, row)
		}
		if old != nil {
			line["old"] = columns(table, old)
		}
	}
	if err := out.Encode(line); err != nil {
		log.Fatalf("write: %v", err)
	}
}

func columns(table *feedv1.RelationDescription, row *feedv1.Row) map[string]any {
	named := map[string]any{}
	for i, value := range row.Values {
		if i < len(table.Columns) {
			named[table.Columns[i].Name] = native(value)
		}
	}
	return named
}

// native maps a feed value to what encoding/json prints.
func native(value *feedv1.Value) any {
	switch v := value.Kind.(type) {
	case *feedv1.Value_Null:
		return nil
	case *feedv1.Value_UnchangedToast:
		return map[string]bool{"unchanged_toast": true}
	case *feedv1.Value_Bool:
		return v.Bool
	case *feedv1.Value_Int64:
		return v.Int64
	case *feedv1.Value_Double:
		return v.Double
	case *feedv1.Value_String_:
		return v.String_
	case *feedv1.Value_Bytes:
		return v.Bytes
	case *feedv1.Value_Decimal:
		return v.Decimal
	case *feedv1.Value_Timestamp:
		return v.Timestamp.AsTime().Format(time.RFC3339Nano)
	case *feedv1.Value_Json:
		return json.RawMessage(v.Json)
	case *feedv1.Value_Array:
		elements := make([]any, len(v.Array.Elements))
		for i, element := range v.Array.Elements {
			elements[i] = native(element)
		}
		return elements
	}
	return nil
}
