-- Lending library schema and the reports the front desk asks for most often.
-- Written for PostgreSQL 15; uses only standard features apart from FILTER and
-- generate_series.

CREATE TABLE branch (
    branch_id   serial PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    opened_on   date NOT NULL
);

CREATE TABLE member (
    member_id   serial PRIMARY KEY,
    full_name   text NOT NULL,
    email       text UNIQUE,
    home_branch integer NOT NULL REFERENCES branch,
    joined_on   date NOT NULL DEFAULT current_date,
    suspended   boolean NOT NULL DEFAULT false
);

CREATE TABLE title (
    title_id    serial PRIMARY KEY,
    isbn        char(13) UNIQUE,
    name        text NOT NULL,
    author      text NOT NULL,
    published   smallint CHECK (published BETWEEN 1400 AND 2100)
);

-- One row per physical copy; a title can have many copies across branches.
CREATE TABLE copy (
    copy_id     serial PRIMARY KEY,
    title_id    integer NOT NULL REFERENCES title,
    branch_id   integer NOT NULL REFERENCES branch,
    acquired_on date NOT NULL,
    withdrawn   boolean NOT NULL DEFAULT false
);

CREATE TABLE loan (
    loan_id     bigserial PRIMARY KEY,
    copy_id     integer NOT NULL REFERENCES copy,
    member_id   integer NOT NULL REFERENCES member,
    borrowed_at timestamptz NOT NULL DEFAULT now(),
    due_on      date NOT NULL,
    returned_at timestamptz,
    CHECK (returned_at IS NULL OR returned_at >= borrowed_at)
);

-- A copy can be out on at most one loan at a time.
CREATE UNIQUE INDEX loan_one_open_per_copy ON loan (copy_id) WHERE returned_at IS NULL;
CREATE INDEX loan_member_open ON loan (member_id) WHERE returned_at IS NULL;

-- Overdue loans with how late they are, oldest first.
SELECT m.full_name,
       m.email,
       t.name                    AS title,
       b.name                    AS branch,
       l.due_on,
       current_date - l.due_on   AS days_late
FROM loan l
JOIN member m ON m.member_id = l.member_id
JOIN copy   c ON c.copy_id   = l.copy_id
JOIN title  t ON t.title_id  = c.title_id
JOIN branch b ON b.branch_id = c.branch_id
WHERE l.returned_at IS NULL
  AND l.due_on < current_date
ORDER BY days_late DESC, m.full_name;

-- Availability of one title at every branch, including branches with no copies.
SELECT b.name AS branch,
       count(c.copy_id) FILTER (WHERE NOT c.withdrawn)                    AS copies,
       count(c.copy_id) FILTER (WHERE NOT c.withdrawn AND l.loan_id IS NULL) AS on_shelf
FROM branch b
LEFT JOIN copy c ON c.branch_id = b.branch_id AND c.title_id = $1
LEFT JOIN loan l ON l.copy_id = c.copy_id AND l.returned_at IS NULL
GROUP BY b.branch_id, b.name
ORDER BY on_shelf DESC, b.name;

-- Loans per week over the last twelve weeks, with empty weeks shown as zero.
WITH weeks AS (
    SELECT generate_series(
               date_trunc('week', current_date) - interval '11 weeks',
               date_trunc('week', current_date),
               interval '1 week') AS week_start
)
SELECT w.week_start::date,
       count(l.loan_id) AS loans
FROM weeks w
LEFT JOIN loan l
       ON l.borrowed_at >= w.week_start
      AND l.borrowed_at <  w.week_start + interval '1 week'
GROUP BY w.week_start
ORDER BY w.week_start;

-- The five most borrowed titles per branch this year, using a window function.
SELECT branch, title, loans
FROM (
    SELECT b.name AS branch,
           t.name AS title,
           count(*) AS loans,
           rank() OVER (PARTITION BY b.branch_id ORDER BY count(*) DESC) AS position
    FROM loan l
    JOIN copy   c ON c.copy_id   = l.copy_id
    JOIN title  t ON t.title_id  = c.title_id
    JOIN branch b ON b.branch_id = c.branch_id
    WHERE l.borrowed_at >= date_trunc('year', current_date)
    GROUP BY b.branch_id, b.name, t.title_id, t.name
) ranked
WHERE position <= 5
ORDER BY branch, position, title;

-- Suspend members who have held any item more than 60 days past its due date.
UPDATE member m
SET suspended = true
WHERE NOT m.suspended
  AND EXISTS (
      SELECT 1
      FROM loan l
      WHERE l.member_id = m.member_id
        AND l.returned_at IS NULL
        AND l.due_on < current_date - 60
  );
